"""`stepscope precision`: the two classic mixed-precision experiments (`experiments`)."""

from stepscope.measure.precision.experiments import accumulate, model_dtypes

__all__ = ["accumulate", "model_dtypes"]
