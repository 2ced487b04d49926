-- turnstile: fixed window (id 4). Window index w = floor(now / P) from the epoch.
--
-- State at KEY: "alg.L.P.B|updated_ms|w|n", n the units admitted in window w.

MAKE[4] = function() return {
  fields = 3,
  fresh = function() return {updated = 0, w = -1, n = 0} end,
  parse = function(q, n)
    -- Written at updated_ms, so in its window; never more than L.
    if n[2] ~= divmod(n[1], q.P) or n[3] > q.L then return nil end
    return {updated = n[1], w = n[2], n = n[3]}
  end,
  decide = function(p, st, now, c)
    local L = p.L
    local w, e = divmod(now, p.P)
    local n = 0
    if st.w == w then n = st.n end
    local to_end = dur_ms(p.P - e)
    local function reset(k)
      if k > 0 then return to_end end
      return ZERO
    end
    local rem = L - n
    if rem < 0 then rem = 0 end
    if c > L then return result(0, rem, nil, reset(n)) end
    if c == 0 then return result(1, rem, ZERO, reset(n)) end
    if n <= L - c then
      local r = result(1, L - n - c, ZERO, reset(n + c))
      r.w, r.n = w, n + c
      return r
    end
    return result(0, rem, to_end, reset(n))
  end,
  admitted = function(p, st, now, r) return {updated = now, w = r.w, n = r.n} end,
  refund = function(p, st, now, c)
    local w = divmod(now, p.P)
    if st.w ~= w then return nil end
    local n = st.n - c
    if n < 0 then n = 0 end
    return {updated = now, w = w, n = n}
  end,
  encode = function(st) return int(st.updated) .. '|' .. int(st.w) .. '|' .. int(st.n) end,
} end
