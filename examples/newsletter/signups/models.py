from django.db import models


class Subscriber(models.Model):
    email = models.EmailField(unique=True)
    plan = models.CharField(max_length=20, default="free")
    welcomed_at = models.DateTimeField(null=True)
