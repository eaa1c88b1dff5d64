import jax

# Strict global settings (house style): accuracy tests run in float64, and implicit
# rank promotion is an error so that broadcasting bugs cannot hide.
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
