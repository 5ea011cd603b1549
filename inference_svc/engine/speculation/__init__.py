"""Speculative decoding drafted from the request's own tokens (prompt lookup), depth tuned online.

- `proposer.py`: the n-gram proposer (longest suffix match in the prompt and output);
- `depth.py`: one request's draft depth, fixed or auto from its acceptance and the engine's load;
- `gate.py`: auto never costs: the measured gain of drafted steps over plain ones caps auto depths
  per batch size, off where drafts do not pay;
- `drafts.py`: the engine's side, end to end: propose, verify, accept, confidence.
"""

from inference_svc.engine.speculation.depth import DepthController, DepthSettings
from inference_svc.engine.speculation.drafts import RequestSpeculation, Speculation, note_confidence, verify
from inference_svc.engine.speculation.gate import GateSettings, SpeculationGate
from inference_svc.engine.speculation.proposer import DEFAULT_NGRAM_SIZES, NgramProposer

__all__ = ["DEFAULT_NGRAM_SIZES", "DepthController", "DepthSettings", "GateSettings", "NgramProposer",
           "RequestSpeculation", "Speculation", "SpeculationGate", "note_confidence", "verify"]
