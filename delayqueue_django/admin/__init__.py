"""The queues in the Django admin: an entry in the sidebar, pages by queue name."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, register_converter
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST, require_safe

from delayqueue_django.admin.views import QueueViews
from delayqueue_django.models import Queue


class MessageIdConverter:
    """Any message id: "str" stops at a slash and "path" at a line break, and a page whose
    message links cannot be built would fail whole."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(MessageIdConverter, "delayqueue_message_id")


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No database rows: the changelist is the queues overview, and every page reads Redis."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return self.views.overview(request)

    @property
    def views(self) -> QueueViews:
        return QueueViews(self)

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site

        def wrap(view: Any) -> Any:
            return site.admin_view(never_cache(view))

        views = self.views
        return [
            path("", wrap(self.changelist_view), name="delayqueue_django_queue_changelist"),
            path("stats.json", wrap(views.all_json), name="delayqueue_django_queue_json"),
            path("<str:queue_name>/", wrap(views.detail), name="delayqueue_django_queue_detail"),
            path(
                "<str:queue_name>/stats.json",
                wrap(views.queue_json),
                name="delayqueue_django_queue_queue_json",
            ),
            path(
                "<str:queue_name>/messages/<delayqueue_message_id:message_id>/",
                wrap(views.message),
                name="delayqueue_django_queue_message",
            ),
            path(
                "<str:queue_name>/payloads/<delayqueue_message_id:message_id>/",
                wrap(require_safe(views.payload)),
                name="delayqueue_django_queue_payload",
            ),
            path(
                "<str:queue_name>/action/",
                wrap(require_POST(views.action)),
                name="delayqueue_django_queue_action",
            ),
            path(
                "<str:queue_name>/purge/", wrap(views.purge), name="delayqueue_django_queue_purge"
            ),
            path(
                "<str:queue_name>/dead-letters/by-error/",
                wrap(views.by_error),
                name="delayqueue_django_queue_by_error",
            ),
            path(
                "<str:queue_name>/schedules/action/",
                wrap(require_POST(views.schedule_action)),
                name="delayqueue_django_queue_schedule_action",
            ),
            path(
                "<str:queue_name>/flow/action/",
                wrap(require_POST(views.flow_action)),
                name="delayqueue_django_queue_flow_action",
            ),
        ]
