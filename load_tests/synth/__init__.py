"""Synthetic retrieval traces calibrated to the Stream2LLM workloads (`streamrag trace synth`).

The Stream2LLM paper (section 6.1, appendix A.1) replays two recorded retriever traces that
we do not have: a crawl4ai web crawl streaming pages in `append` mode, and a DiskANN search
with AquaPipe-style early results streaming refined top-k lists in `update` mode. This
package draws traces whose statistics match the figures the paper publishes and fills them
with real text from our passage store, so the token counts are real tokens.

- `published`: the published figures (typed once) and the targets at given scales;
- `tokens`: token counting (the embedded model's tokenizer, or a calibrated approximation);
- `passage_pool`: the store's passages, cut into documents of a given token length;
- `fitting`: the split lognormal fit and stratified quantile draws;
- `models`: one `WorkloadModel` per workload (the distributions, in words in its docstring);
- `synthesize`: the parameters, the draw of each query's chunks, and the trace header;
- `trace_stats`: the published statistics measured on any trace, and the comparison table.

The command line is `load_tests.trace_synth`.
"""
