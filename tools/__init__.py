"""Development tools that run from a checkout (python -m tools.<name>); they are not part of the
installed package: the spec pipeline (spec/), benchmarks (bench/) and the test-model builders
(testmodels/)."""
