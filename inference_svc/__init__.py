"""inference_svc package."""
