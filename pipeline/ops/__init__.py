"""Operations beside the runs: the reconciler of lost events and setting repositories up on a forge."""
