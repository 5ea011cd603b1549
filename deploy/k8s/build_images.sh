#!/usr/bin/env bash
# Builds the streamrag images for a cluster from the compose Dockerfiles, with one tag scheme,
# REGISTRY/streamrag-KIND:TAG, optionally pushes them, and prints the `kustomize edit set image`
# lines that point an overlay at them (deploy/k8s/README.md, "Images").
#
#   REGISTRY=registry.example.com/streamrag TAG=$(git rev-parse --short HEAD) \
#     bash deploy/k8s/build_images.sh [--gpu] [--vllm] [--milvus] [--push]
#
# Always: corpus, retriever, inference (CPU torch), orchestrator, gateway. --gpu: inference-cuda
# (torch from STREAMRAG_CUDA_TORCH_INDEX_URL); --vllm: inference-vllm on it (implies --gpu);
# --milvus: retriever-milvus. The compose variables apply (compose/README.md): STREAMRAG_BASE_IMAGE,
# STREAMRAG_TORCH_INDEX_URL, STREAMRAG_INDEX_SOURCE.
set -euo pipefail
cd "$(dirname "$0")/../.."

registry=${REGISTRY:?set REGISTRY, e.g. registry.example.com/streamrag}
tag=${TAG:-$(git rev-parse --short HEAD)}
base=${STREAMRAG_BASE_IMAGE:-python:3.11-slim-bookworm}
torch_index=${STREAMRAG_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
cuda_torch_index=${STREAMRAG_CUDA_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}
index_source=${STREAMRAG_INDEX_SOURCE:-/usr/share/doc/python3.11/html}
gpu=0 vllm=0 milvus=0 push=0
for arg in "$@"; do
  case $arg in
    --gpu) gpu=1 ;;
    --vllm) vllm=1 gpu=1 ;;
    --milvus) milvus=1 ;;
    --push) push=1 ;;
    *) echo "unknown argument: $arg (--gpu, --vllm, --milvus, --push)" >&2; exit 2 ;;
  esac
done

built=()
build() {   # build KIND DOCKERFILE [--build-arg ...]
  local kind=$1 dockerfile=$2; shift 2
  local image="$registry/streamrag-$kind:$tag"
  printf '\n==> %s\n' "$image"
  docker build -f "$dockerfile" -t "$image" --build-arg "BASE_IMAGE=$base" "$@" .
  built+=("$kind")
}

build corpus compose/Dockerfile.corpus --build-arg "TORCH_INDEX_URL=$torch_index"
build retriever compose/Dockerfile.retriever --build-arg "TORCH_INDEX_URL=$torch_index" \
  --build-arg "INDEX_SOURCE=$index_source"
build inference compose/Dockerfile.inference --build-arg "TORCH_INDEX_URL=$torch_index"
build orchestrator compose/Dockerfile.orchestrator --build-arg "TORCH_INDEX_URL=$torch_index"
build gateway compose/Dockerfile.gateway --build-arg "TORCH_INDEX_URL=$torch_index"
if (( milvus )); then
  build retriever-milvus compose/Dockerfile.retriever-milvus --build-arg "RETRIEVER_IMAGE=$registry/streamrag-retriever:$tag"
fi
if (( gpu )); then
  build inference-cuda compose/Dockerfile.inference --build-arg "TORCH_INDEX_URL=$cuda_torch_index"
fi
if (( vllm )); then
  build inference-vllm deploy/k8s/images/Dockerfile.inference-vllm \
    --build-arg "INFERENCE_IMAGE=$registry/streamrag-inference-cuda:$tag"
fi

if (( push )); then
  for kind in "${built[@]}"; do docker push "$registry/streamrag-$kind:$tag"; done
fi
printf '\nPoint an overlay at these images (from its directory):\n'
for kind in "${built[@]}"; do
  echo "  kustomize edit set image streamrag-$kind=$registry/streamrag-$kind:$tag"
done
