# Test layout: each op's tests live in its folder (ops/<op>/test_<op>.py); cross-cutting tests in
# tests/python. Every op test file uses opbridge.testing.
