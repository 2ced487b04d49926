-- turnstile: sliding window counter (id 6). Windows as in fixed window; with n the current
-- window's count, m the previous one's and e = now - w * P, the estimate is
-- est = m * (P - e) / P + n. Admit iff est + c <= L: deny at once when n + c > L, else
-- compare m * (P - e) <= (L - n - c) * P, so nothing exceeds L * P.
--
-- State at KEY: "alg.L.P.B|updated_ms|w|n|m".

-- The (current, previous) counts of a sliding state (period P) seen from window w.
local function sliding_counts(st, w)
  if st.w == w then return st.cur, st.prev end
  if st.w + 1 == w then return 0, st.cur end
  return 0, 0
end

-- floor(L - est) (at least 0) with k counted in the current window, weighted = m * (P - e).
local function sliding_remaining(L, P, weighted, k)
  if k > L then return 0 end
  local free = (L - k) * P - weighted
  if free <= 0 then return 0 end
  return divmod(free, P)
end

-- reset_after with k counted in the current window and m in the previous one.
local function sliding_reset(P, e, m, k)
  if k > 0 then return dur_ms(2 * P - e) end
  if m > 0 then return dur_ms(P - e) end
  return ZERO
end

MAKE[6] = function() return {
  fields = 4,
  fresh = function() return {updated = 0, w = -2, cur = 0, prev = 0} end,
  parse = function(q, updated, w, cur, prev)
    -- Written at updated_ms, so in its window; neither count ever more than L.
    if w ~= divmod(updated, q.P) or cur > q.L or prev > q.L then return nil end
    return {updated = updated, w = w, cur = cur, prev = prev}
  end,
  decide = function(p, st, now, c)
    local L, P = p.L, p.P
    local w, e = divmod(now, P)
    local n, m = sliding_counts(st, w)
    local weighted = m * (P - e)
    local rem = sliding_remaining(L, P, weighted, n)
    if c > L then return result(0, rem, nil, sliding_reset(P, e, m, n)) end
    if c == 0 then return result(1, rem, ZERO, sliding_reset(P, e, m, n)) end
    if n + c > L then
      -- wait for the next window (m' = n, n' = 0): (P - e) + P * (n + c - L) / n
      local d = dur(P * (n + c - L), n)
      d[1] = d[1] + (P - e)
      return result(0, rem, d, sliding_reset(P, e, m, n))
    end
    if weighted <= (L - n - c) * P then
      local r = result(1, sliding_remaining(L, P, weighted, n + c), ZERO, dur_ms(2 * P - e))
      r.w, r.n, r.m = w, n + c, m
      return r
    end
    -- the previous window's weight must decay: (m * (P - e) - (L - n - c) * P) / m
    return result(0, rem, dur(weighted - (L - n - c) * P, m), sliding_reset(P, e, m, n))
  end,
  admitted = function(p, st, now, r) return {updated = now, w = r.w, cur = r.n, prev = r.m} end,
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
    return format('%s|%.0f|%.0f|%.0f|%.0f', params, st.updated, st.w, st.cur, st.prev)
  end,
} end
