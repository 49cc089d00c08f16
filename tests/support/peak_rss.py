"""Runs a program as `systemd-socket-activate` hands one on (leading `--setenv=NAME=VALUE`
arguments become its environment), waits for it, then writes {"peak_rss_kb": N} on its
standard error: the largest resident set any process of its tree reached (the waited-for
descendants' ru_maxrss), and exits with its status. The tests read what a refusal cost.

usage: peak_rss.py [--setenv=NAME=VALUE]... PROGRAM [ARG]..."""
import json
import os
import resource
import subprocess
import sys

args = sys.argv[1:]
env = {}
while args and args[0].startswith("--setenv="):
    name, value = args.pop(0)[len("--setenv="):].split("=", 1)
    env[name] = value
code = subprocess.run(args, env=env).returncode
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"peak_rss_kb": peak}), file=sys.stderr, flush=True)
sys.exit(code if code >= 0 else 128 - code)
