#!/bin/bash
# experiment: lower the priority of vLLM's engine-core process (its process title is VLLM::EngineCore)
# once a second, so that its spin-wait yields to the worker's compute threads
while true; do
  for pid in $(pgrep -f '^VLLM::EngineCore'); do
    cur=$(ps -o ni= -p $pid 2>/dev/null | tr -d ' ')
    if [ -n "$cur" ] && [ "$cur" != "19" ]; then
      for tid in $(ls /proc/$pid/task); do renice -n 19 -p $tid >/dev/null 2>&1; done
      echo "$(date +%T) reniced $pid" >> out/s15/nice.log
    fi
  done
  sleep 1
done
