"""The sensors' tests (sensors/): ticks, alerts, the lane watch."""
