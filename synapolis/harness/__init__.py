"""The harnesses (contract §11): their hooks (`hooks`), wiring the hooks into a project (`install`) and
what a harness's own settings decide about them (`settings`). Importing this package imports nothing."""
