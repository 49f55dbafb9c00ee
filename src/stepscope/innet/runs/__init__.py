"""What the `innet` commands run, each writing its own records: `bench` (innet vs gloo), `timeout_profile`,
`train` (DDP through the switch), all started through `runner` (world, switch, ranks); `reference` holds the
inputs every rank can regenerate and the checks of results against them."""
