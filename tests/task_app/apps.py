from django.apps import AppConfig


class TaskAppConfig(AppConfig):
    name = "tests.task_app"
    label = "task_app"
    default_auto_field = "django.db.models.BigAutoField"
