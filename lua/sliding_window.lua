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

MAKE[6] = function() return {
  fields = 4,
  fresh = function() return {updated = 0, w = -2, cur = 0, prev = 0} end,
  parse = function(q, n)
    -- Written at updated_ms, so in its window; neither count ever more than L.
    if n[2] ~= divmod(n[1], q.P) or n[3] > q.L or n[4] > q.L then return nil end
    return {updated = n[1], w = n[2], cur = n[3], prev = n[4]}
  end,
  decide = function(p, st, now, c)
    local L, P = p.L, p.P
    local w, e = divmod(now, P)
    local n, m = sliding_counts(st, w)
    local weighted = m * (P - e)
    local function remaining(k)
      if k > L then return 0 end
      local free = (L - k) * P - weighted
      if free <= 0 then return 0 end
      local q = divmod(free, P)
      return q
    end
    local function reset(k)
      if k > 0 then return dur_ms(2 * P - e) end
      if m > 0 then return dur_ms(P - e) end
      return ZERO
    end
    if c > L then return result(0, remaining(n), nil, reset(n)) end
    if c == 0 then return result(1, remaining(n), ZERO, reset(n)) end
    if n + c > L then
      -- wait for the next window (m' = n, n' = 0): (P - e) + P * (n + c - L) / n
      local d = dur(P * (n + c - L), n)
      d[1] = d[1] + (P - e)
      return result(0, remaining(n), d, reset(n))
    end
    if weighted <= (L - n - c) * P then
      local r = result(1, remaining(n + c), ZERO, reset(n + c))
      r.w, r.n, r.m = w, n + c, m
      return r
    end
    -- the previous window's weight must decay: (m * (P - e) - (L - n - c) * P) / m
    return result(0, remaining(n), dur(weighted - (L - n - c) * P, m), reset(n))
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
  encode = function(st)
    return int(st.updated) .. '|' .. int(st.w) .. '|' .. int(st.cur) .. '|' .. int(st.prev)
  end,
} end
