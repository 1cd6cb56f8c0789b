"""The admin's queue pages: an overview, one page per queue, a message page, the actions
and a JSON view of the counts. Every page costs a bounded number of Redis round trips,
however many messages a queue holds: counts in one script, lists by range with a limit (the
dead letters' filter by error class reads at most a bounded number of them, in batches).

The views come in parts: the queue pages and their JSON (admin.queue_pages), the message
pages (admin.message_pages) and the actions (admin.actions; admin.error_actions for those
on the dead letters of one error class), over admin.view_base.
"""

from delayqueue_django.admin.error_actions import ErrorClassActions
from delayqueue_django.admin.message_pages import MessagePages
from delayqueue_django.admin.queue_pages import QueuePages


class QueueViews(QueuePages, MessagePages, ErrorClassActions):
    """The views, bound to the ModelAdmin that registers them."""
