"""The gates: named, executable checks that decide whether the async runner may be switched on."""
