-- turnstile: GCRA (id 2), the generic cell rate algorithm with emission interval T = P / L
-- and tolerance (B - 1) * T.
--
-- State at KEY: "alg.L.P.B|updated_ms|ahead_ms|tat_frac": the theoretical arrival time
-- TAT = updated_ms + ahead_ms + tat_frac / L ms, kept exactly and relative to the last
-- update, so no stored number passes 2^53 when times approach it (an absolute TAT can reach
-- 2^53 - 1 + B * T). It is compared with now relative to now (D = (TAT - now) * L, at most
-- B * P; see debt_now in bucket.lua), never as an absolute time times L, which would leave
-- the exact range of doubles. A request of cost c conforms iff TAT - (B - c) * T <= now;
-- the TAT then moves to max(TAT, now) + c * T. Decisions, admissions and refunds are the
-- token bucket's, on that debt; only the stored state differs.

MAKE[2] = function()
  local gcra = bucket(false)
  gcra.fields = 3
  gcra.fresh = function() return {updated = 0, ahead = 0, frac = 0} end
  gcra.parse = function(q, updated, ahead, frac)
    -- 0 <= frac < L, and the debt ahead * L + frac at the last update is at most B * P.
    local most, most_frac = divmod(q.B * q.P, q.L)
    if frac >= q.L or ahead > most or (ahead == most and frac > most_frac) then return nil end
    return {updated = updated, ahead = ahead, frac = frac}
  end
  gcra.encode = function(params, st)
    return format('%s|%d|%d|%d', params, st.updated, st.ahead, st.frac)
  end
  return gcra
end
