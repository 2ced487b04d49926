-- turnstile: fixed window (id 4). Window index w = floor(now / P) from the epoch.
--
-- State at KEY: "alg.L.P.B|updated_ms|w|n", n the units admitted in window w.

MAKE[4] = function() return {
  fields = 3,
  fresh = function() return {updated = 0, w = -1, n = 0} end,
  parse = function(q, updated, w, n)
    -- Written at updated_ms, so in its window; never more than L.
    if w ~= divmod(updated, q.P) or n > q.L then return nil end
    return {updated = updated, w = w, n = n}
  end,
  decide = function(p, st, now, c)
    local L = p.L
    local w, e = divmod(now, p.P)
    local n = 0
    if st.w == w then n = st.n end
    -- reset_after: to the window's end once anything is counted in it
    local to_end = dur_ms(p.P - e)
    local reset = ZERO
    if n > 0 then reset = to_end end
    local rem = L - n
    if rem < 0 then rem = 0 end
    if c > L then return result(0, rem, nil, reset) end
    if c == 0 then return result(1, rem, ZERO, reset) end
    if n <= L - c then
      local r = result(1, L - n - c, ZERO, to_end)
      r.w, r.n = w, n + c
      return r
    end
    return result(0, rem, to_end, reset)
  end,
  admitted = function(p, st, now, r) return {updated = now, w = r.w, n = r.n} end,
  refund = function(p, st, now, c)
    local w = divmod(now, p.P)
    if st.w ~= w then return nil end
    local n = st.n - c
    if n < 0 then n = 0 end
    return {updated = now, w = w, n = n}
  end,
  encode = function(params, st) return format('%s|%.0f|%.0f|%.0f', params, st.updated, st.w, st.n) end,
} end
