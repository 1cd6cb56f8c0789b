"""The core: settings, ``Queue``, the registry of queues built from settings, payload
encoding, handler resolution and the message types. It wraps the engine with Django and
knows no feature: the wings plug into it (see ``core.features``)."""
