"""What tests/hosts/held_oneshot/sitecustomize.py prints as oneshot starts waiting, for the tests that use it."""
HELD_IN_ONESHOT = "held_oneshot: oneshot waits for a signal"
