"""The admin's "Reschedule…" form: the new due time of the messages selected, as a delay
from now or a date and time (in TIME_ZONE), checked whole before anything is written."""

from typing import Any

from django import forms
from django.template.defaultfilters import date as format_date
from django.utils import timezone

from delayqueue_django.core.encoding import due_spec
from delayqueue_django.exceptions import InvalidDelay

TIME_FORMAT = "Y-m-d H:i:s T"


class RescheduleForm(forms.Form):
    delay = forms.FloatField(
        required=False,
        min_value=0,
        label="In (seconds from now)",
        widget=forms.NumberInput(attrs={"step": "any", "min": "0", "size": 12}),
    )
    at = forms.DateTimeField(
        required=False,
        label="Or at",
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
        ),
    )

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if self.errors:
            return cleaned
        delay, at = cleaned.get("delay"), cleaned.get("at")
        if delay is None and at is None:
            raise forms.ValidationError("Give a delay or a time.")
        if delay is not None and at is not None:
            raise forms.ValidationError("Give a delay or a time, not both.")
        if at is not None and at < timezone.now():
            now = format_date(timezone.localtime(), TIME_FORMAT)
            raise forms.ValidationError(
                f"That time has passed (it is now {now}); for due now, give a delay of 0."
            )
        try:
            due_spec(delay, at)  # the queue's own checks, so that none fails half-way
        except InvalidDelay as error:
            raise forms.ValidationError(str(error)) from None
        return cleaned

    def described(self) -> str:
        """The valid form's new time, for the message that says what was done."""
        delay, at = self.cleaned_data["delay"], self.cleaned_data["at"]
        if delay is not None:
            return "due now" if delay == 0 else f"due in {delay:g} s"
        return f"due at {format_date(timezone.localtime(at), TIME_FORMAT)}"
