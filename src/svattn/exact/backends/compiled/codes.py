"""Status codes, output indices and numeric settings shared by the compiled kernels."""

# status codes of drive_events
DONE, NEED_RESOLVE, NEED_COLUMNS, EMPTY_MARGIN, FALLBACK = 0, 1, 2, 3, 4
# loop[...] indices (ILL_BORDER: 1 once an expansion bordered the inverse ill-conditioned,
# ``core.cache.ILL_SCHUR``; the drive then sets ``SlotState.ill_border``)
EVENTS, ZERO_STEPS, LAST_LEFT, LAST_ENTERED, ILL_BORDER = 0, 1, 2, 3, 4
LOOP_SLOTS = 5  # the loop-status array's length
# remove_segments' integer outputs: out[...] indices
(SEG_EVENTS, SEG_ESUM_UPDATES, SEG_LAST_LEFT, SEG_LAST_ENTERED, SEG_SYNC, SEG_GRAM,
 SEG_PASSES, SEG_JUMPED, SEG_MARGIN, SEG_ERROR, SEG_RESERVE, SEG_UNIQUE,
 SEG_SUPPORT, SEG_ILL) = range(14)
SEG_OUT = SEG_ILL + 1  # the output's length (SEG_ILL: as the loop's ILL_BORDER)
# the float outputs of a finished removal: KKT residual, cond1, inverse residual
FACT_KKT, FACT_COND, FACT_INV_RES = range(3)

RATE_TOL = 1e-13
# Reassociation lets LLVM vectorize the dot products (a rounding-level change);
# no flag that assumes away NaN or inf, which the step tests rely on.
VEC = {"reassoc", "contract"}
# where remove_segments wrote the inverse it returns: a fresh array, the spare buffer, or
# over the old inverse's own memory
WRITTEN_FRESH, WRITTEN_IN_SPARE, WRITTEN_IN_PLACE = range(3)
