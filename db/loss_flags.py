"""What the loss did to one token of a trained sample, as the bits of its ``loss_flags``."""

from enum import IntFlag


class LossFlag(IntFlag):
    """The bits of a sample's ``loss_flags``: what the loss did to one token."""

    TRAINED = 1  # in the loss (its loss mask, times the 80/20 entropy mask if any)
    CORRECTED = 2  # importance-corrected: ratio against pi_prox, behaviour weight applied
    CLIPPED = 4  # one of the policy loss's clip flags was active on it

    @classmethod
    def of(cls, trained: bool, corrected: bool, clipped: bool) -> int:
        """One token's flags as stored."""
        return int(
            (cls.TRAINED if trained else 0)
            | (cls.CORRECTED if corrected else 0)
            | (cls.CLIPPED if clipped else 0)
        )
