"""pytest plugin for colo-fsm lifecycle tests (filled by the testing package)."""
