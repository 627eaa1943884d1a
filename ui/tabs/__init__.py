"""One module per tab: layout and event wiring only; the work happens in `ui.handlers`."""
