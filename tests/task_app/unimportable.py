"""A task module that raises as it is imported (a setting missing in the worker's
environment, say): a worker must refuse its messages at once, not retry them."""

import sys

from tests.task_app.tasks import unimportable_exits

if unimportable_exits["exit"]:
    sys.exit(3)
raise RuntimeError("SHOP_API_KEY is not set")
