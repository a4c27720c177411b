# jobsd's pytest plugin: a throwaway migrated database, emptied before each test
# (jobsd_db), and a worker that runs the queued jobs here (jobsd_worker)
pytest_plugins = ["jobsd.testing"]
