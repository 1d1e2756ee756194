"""A private Docker engine and a stand-in vLLM image for the ops tests.

`engine.PrivateDockerd` starts `dockerd` with its own data-root, exec-root, socket and pidfile under a
temp dir (no bridge, no iptables, no forwarding) and stops it by PID. `standin.build_standin_image`
imports a busybox rootfs whose `vllm` entry behaves like the parts of a vLLM container the ops
commands read. Nothing here pulls from a registry.
"""
