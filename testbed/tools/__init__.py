"""Commands that look at the host or the testbed itself: ``doctor`` (what works here),
the benchmarks (``bench_rpc``, ``bench_link``, ``bench_episode``, with ``echo_probe``)
and the trace views (``traces_view``)."""
