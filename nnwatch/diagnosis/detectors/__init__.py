"""One detector per kind of training problem; ``ALL_DETECTORS`` is the order they run in."""

from __future__ import annotations

from nnwatch.diagnosis.detectors.amp_scale_collapse import AmpScaleCollapseDetector
from nnwatch.diagnosis.detectors.bad_initial_loss import BadInitialLossDetector
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.detectors.clipping_misuse import ClippingMisuseDetector
from nnwatch.diagnosis.detectors.dead_relu import DeadReluDetector
from nnwatch.diagnosis.detectors.exploding_gradients import ExplodingGradientsDetector
from nnwatch.diagnosis.detectors.game_balance import GameBalanceDetector
from nnwatch.diagnosis.detectors.loss_diverging import LossDivergingDetector
from nnwatch.diagnosis.detectors.loss_spike import LossSpikeDetector
from nnwatch.diagnosis.detectors.loss_stalled import LossStalledDetector
from nnwatch.diagnosis.detectors.nan_or_inf import NanOrInfDetector
from nnwatch.diagnosis.detectors.oscillating_loss import OscillatingLossDetector
from nnwatch.diagnosis.detectors.saturated_activation import SaturatedActivationDetector
from nnwatch.diagnosis.detectors.setup_fault import SetupFaultDetector
from nnwatch.diagnosis.detectors.vanishing_gradients import VanishingGradientsDetector
from nnwatch.diagnosis.detectors.zero_gradient_layer import ZeroGradientLayerDetector

ALL_DETECTORS: tuple[type[Detector], ...] = (
    NanOrInfDetector,
    SetupFaultDetector,
    BadInitialLossDetector,
    ClippingMisuseDetector,
    ExplodingGradientsDetector,
    VanishingGradientsDetector,
    DeadReluDetector,
    SaturatedActivationDetector,
    ZeroGradientLayerDetector,
    AmpScaleCollapseDetector,
    LossDivergingDetector,
    LossSpikeDetector,
    OscillatingLossDetector,
    LossStalledDetector,
    GameBalanceDetector,
)

__all__ = [
    "ALL_DETECTORS",
    "AmpScaleCollapseDetector",
    "BadInitialLossDetector",
    "ClippingMisuseDetector",
    "DeadReluDetector",
    "Detector",
    "ExplodingGradientsDetector",
    "GameBalanceDetector",
    "LossDivergingDetector",
    "LossSpikeDetector",
    "LossStalledDetector",
    "NanOrInfDetector",
    "OscillatingLossDetector",
    "SaturatedActivationDetector",
    "SetupFaultDetector",
    "VanishingGradientsDetector",
    "ZeroGradientLayerDetector",
]
