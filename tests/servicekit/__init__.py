"""The shared service plumbing (servicekit/): health, reflection, metrics, signals, channels that wait for ready, the
client's side of a resumed Ask."""
