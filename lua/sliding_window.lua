-- turnstile: sliding window counter (id 6). Windows as in fixed window; with n the current
-- window's count, m the previous one's and e = now - w * P, the estimate is
-- est = m * (P - e) / P + n. Admit iff est + c <= L: deny at once when n + c > L, else
-- compare m * (P - e) <= (L - n - c) * P, so nothing exceeds L * P.
--
-- State at KEY: "alg.L.P.B|updated_ms|n|m", n counted in updated_ms's window
-- w = floor(updated_ms / P), m in the one before.

-- The (current, previous) counts of a sliding state (period P) seen from window w.
local function sliding_counts(st, w)
  if st.w == w then return st.cur, st.prev end
  if st.w + 1 == w then return 0, st.cur end
  return 0, 0
end

MAKE[6] = function() return {
  fresh = function() return {updated = 0, w = -2, cur = 0, prev = 0} end,
  parse = function(q, updated, cur, prev)
    -- Neither count ever more than L.
    if cur > q.L or prev > q.L then return nil end
    return {updated = updated, w = divmod(updated, q.P), cur = cur, prev = prev}
  end,
  -- Writes retry as whole, num, den (whole + num / den ms; -1, 0, 1: never), remaining, and
  -- reset in whole ms.
  decide = function(p, st, now, c, out, o)
    local L, P = p.L, p.P
    local e = now % P
    local w = (now - e) / P
    local n, m = sliding_counts(st, w)
    local weighted = m * (P - e)
    local rw, rn, rd, k = -1, 0, 1, n
    if c == 0 then
      rw = 0
    elseif c <= L then
      if n + c > L then
        -- wait for the next window (m' = n, n' = 0): (P - e) + P * (n + c - L) / n
        local num = P * (n + c - L)
        rn, rd = num % n, n
        rw = (num - rn) / n + (P - e)
      elseif weighted <= (L - n - c) * P then
        rw, k = 0, n + c
        p.w, p.n, p.m = w, k, m
      else
        -- the previous window's weight must decay: (m * (P - e) - (L - n - c) * P) / m
        local num = weighted - (L - n - c) * P
        rn, rd = num % m, m
        rw = (num - rn) / m
      end
    end
    local reset = 0
    if k > 0 then reset = 2 * P - e elseif m > 0 then reset = P - e end
    out[o + 1], out[o + 2], out[o + 3] = rw, rn, rd
    out[o + 4], out[o + 5] = sliding_remaining(L, P, weighted, k), reset
    return rw == 0 and rn == 0, reset
  end,
  -- In place: st (in p's terms, read by this call only) is not used again.
  admitted = function(p, st, now)
    st.updated, st.w, st.cur, st.prev = now, p.w, p.n, p.m
    return st
  end,
  refund = function(p, st, now, c)
    local w = divmod(now, p.P)
    if st.w ~= w and st.w + 1 ~= w then return nil end
    local n, m = sliding_counts(st, w)
    local take = min(c, n)
    m = m - (c - take)
    if m < 0 then m = 0 end
    return {updated = now, w = w, cur = n - take, prev = m}
  end,
  encode = function(params, st)
    return format('%s|%d|%d|%d', params, st.updated, st.cur, st.prev)
  end,
} end
