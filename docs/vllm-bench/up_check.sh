#!/bin/bash
# The by-hand check of issue 16: the stack on vLLM with lcas, on the tiny corpus; one ask; down.
cd /work/wt16
SR=/opt/vllm-venv/bin/streamrag
set -x
date -u
$SR up --backend vllm --policy lcas --corpus-root out/tiny/site --index out/tiny/index --port-offset 40 --run-dir /tmp/vllm-stack16
$SR status --run-dir /tmp/vllm-stack16
$SR ask --orchestrator 127.0.0.1:50091 "How do I read a file line by line?"
$SR ask --orchestrator 127.0.0.1:50091 --retriever crawler "How do I read a file line by line?"
$SR status --run-dir /tmp/vllm-stack16
grep -h -i "custom scheduler\|PolicyStreaming" /tmp/vllm-stack16/*.log /tmp/vllm-stack16/*/*.log 2>/dev/null | head -3
$SR down --run-dir /tmp/vllm-stack16
date -u
