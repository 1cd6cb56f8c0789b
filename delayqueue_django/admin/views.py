"""The admin's queue pages: an overview, one page per queue, a message page, the actions
and a JSON view of the counts. Every page costs a fixed number of Redis round trips, however
many messages a queue holds: counts in one script, lists by range with a limit.

The views come in parts: the queue pages and their JSON (admin.queue_pages), the message
pages (admin.message_pages) and the actions (admin.actions), over admin.view_base.
"""

from delayqueue_django.admin.actions import Actions
from delayqueue_django.admin.message_pages import MessagePages
from delayqueue_django.admin.queue_pages import QueuePages


class QueueViews(QueuePages, MessagePages, Actions):
    """The views, bound to the ModelAdmin that registers them."""
