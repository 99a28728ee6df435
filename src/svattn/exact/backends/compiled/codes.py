"""Status codes, output indices and numeric settings shared by the compiled kernels."""

# status codes of drive_events
DONE, NEED_RESOLVE, NEED_COLUMNS, EMPTY_MARGIN, FALLBACK = 0, 1, 2, 3, 4
# loop[...] indices
EVENTS, ZERO_STEPS, LAST_LEFT, LAST_ENTERED = 0, 1, 2, 3
# remove_segments' integer outputs: out[...] indices
(SEG_EVENTS, SEG_ESUM_UPDATES, SEG_LAST_LEFT, SEG_LAST_ENTERED, SEG_SYNC, SEG_GRAM,
 SEG_PASSES, SEG_JUMPED, SEG_MARGIN, SEG_ERROR, SEG_RESERVE, SEG_UNIQUE,
 SEG_SUPPORT) = range(13)
SEG_OUT = SEG_SUPPORT + 1  # the output's length
# the float outputs of a finished removal: KKT residual, cond1, inverse residual
FACT_KKT, FACT_COND, FACT_INV_RES = range(3)

RATE_TOL = 1e-13
# Reassociation lets LLVM vectorize the dot products (a rounding-level change);
# no flag that assumes away NaN or inf, which the step tests rely on.
VEC = {"reassoc", "contract"}
