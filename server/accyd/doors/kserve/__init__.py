"""The KServe v2 / Open Inference Protocol door: accy's pipelines served as models."""
