"""Pure decisions (issue 34): no I/O, no store; each module imports the ground only."""
