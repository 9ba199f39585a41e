"""The XLA flags every test process compiles with (no imports: the 8-device workers read it
before jax starts). With XLA's backend optimisation and its CPU fusion emitters off, compiles take
about half the time (the compiled code is slower, which tests of a few steps do not feel). Flags
the installed XLA does not know (jaxlib 0.12 has no fusion emitters flag) are left out by
``txf.runtime.process.add_xla_flags``."""

TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
