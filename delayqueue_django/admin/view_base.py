"""What every admin page of the queues stands on: permissions, the queue a URL names, the
admin's context and URLs, a page for a Redis that cannot be reached; and the actions' table,
which the pages offer and the actions apply."""

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import STATES
from delayqueue_django.exceptions import UnknownQueue

PAGE_SIZE = 50

# The states of a message that waits to be handed out: those a reschedule acts on.
WAITING = ("pending", "ready", "retry")
# Which actions apply to which state, and the permission each needs.
ACTIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "requeue": ("Requeue (fresh retry budget)", "change", ("garbage",)),
    "deliver_now": ("Deliver now", "change", ("pending",)),
    # Asks for the new time on a page of its own (see Actions._reschedule).
    "reschedule": ("Reschedule…", "change", WAITING),
    "delete": ("Delete", "delete", STATES),
}


class ViewsBase:
    """The views, bound to the ModelAdmin that registers them."""

    def __init__(self, model_admin: "admin.ModelAdmin[Any]") -> None:
        self.model_admin = model_admin
        self.admin_site = model_admin.admin_site
        self.opts = model_admin.model._meta

    # Permissions

    def _can(self, request: HttpRequest, permission: str) -> bool:
        """As elsewhere in the admin, which lists the queues for these users: the change
        permission lets one view too."""
        checks = {
            "view": self.model_admin.has_view_permission,
            "change": self.model_admin.has_change_permission,
            "delete": self.model_admin.has_delete_permission,
        }
        return checks[permission](request)

    def _require(self, request: HttpRequest, permission: str) -> None:
        if not self._can(request, permission):
            raise PermissionDenied

    def _unavailable(
        self,
        request: HttpRequest,
        template: str,
        title: str,
        queue: Queue,
        error: RedisError,
        **extra: Any,
    ) -> TemplateResponse:
        """The page, saying Redis cannot be reached (503), instead of a server error."""
        context = self._context(request, title, queue=queue, redis_error=str(error), **extra)
        return TemplateResponse(request, f"admin/delayqueue_django/{template}", context, status=503)

    def _queue(self, name: str) -> Queue:
        try:
            return registry.get_queue(name)
        except UnknownQueue:
            raise Http404(f"No queue named {name!r} in DELAYQUEUES.") from None

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "app_label": self.opts.app_label,
            "can_change": self._can(request, "change"),
            "can_delete": self._can(request, "delete"),
            **extra,
        }

    def _url(self, name: str, *args: str) -> str:
        return reverse(f"{self.admin_site.name}:delayqueue_django_queue_{name}", args=args)
