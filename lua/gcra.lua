-- turnstile: GCRA (id 2), the generic cell rate algorithm (the ATM Forum's, in the virtual
-- scheduling form) with emission interval T = P / L and tolerance (B - 1) * T.
--
-- State at KEY: "alg.L.P.B|updated_ms|debt", the token bucket's: the theoretical arrival
-- time TAT = updated_ms + debt / L ms, kept exactly and relative to the last update, so no
-- stored number passes 2^53 when times approach it (an absolute TAT can reach 2^53 - 1 +
-- B * T, and TAT * L leaves the exact range of doubles). The debt (TAT - now) * L at now is
-- at most B * P (see debt_now in bucket.lua). A request of cost c conforms iff TAT - (B - c)
-- * T <= now; the TAT then moves to max(TAT, now) + c * T. Decisions, admissions, refunds
-- and the stored state are the token bucket's, on that debt.

MAKE[2] = function() return bucket(false) end
