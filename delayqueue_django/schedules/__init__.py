"""Recurring messages: schedules whose ticks are ordinary messages of their queue, written
once each by whichever worker gets there first (see ``engine/lua/schedule.lua``), with no
scheduler process and no lock."""
