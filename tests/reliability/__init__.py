"""Reliability suite (issue 11): faults, bad input and untrusted files; each test asserts the exit code, the
message, that no partial output is left and that pre-existing files are untouched."""
