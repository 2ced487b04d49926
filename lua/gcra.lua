-- turnstile: GCRA (id 2), the generic cell rate algorithm with emission interval T = P / L
-- and tolerance (B - 1) * T.
--
-- State at KEY: "alg.L.P.B|updated_ms|tat_ms|tat_frac": the theoretical arrival time
-- TAT = tat_ms + tat_frac / L ms, kept exactly. It is compared with now relative to now
-- (D = (TAT - now) * L, at most B * P; see debt_now in bucket.lua), never as an absolute
-- time times L, which would leave the exact range of doubles. A request of cost c conforms
-- iff TAT - (B - c) * T <= now; the TAT then moves to max(TAT, now) + c * T. Decisions,
-- admissions and refunds are the token bucket's, on that debt; only the stored state
-- differs.

local gcra = bucket(false)
gcra.fields = 3
gcra.fresh = function() return {updated = 0, tat_ms = 0, frac = 0} end
gcra.parse = function(q, n)
  if n[3] >= q.L then return nil end
  return {updated = n[1], tat_ms = n[2], frac = n[3]}
end
gcra.encode = function(st)
  return int(st.updated) .. '|' .. int(st.tat_ms) .. '|' .. int(st.frac)
end
ALG[2] = gcra
