from django.urls import path

from signups import views

urlpatterns = [
    path("subscribe", views.subscribe),
    path("welcome/<str:result_id>", views.welcome_status),
]
