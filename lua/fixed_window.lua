-- turnstile: fixed window (id 4). Window index w = floor(now / P) from the epoch.
--
-- State at KEY: "fp|updated_ms|w|n", n the units admitted in window w.

ALG[4] = {
  read = function(p, now)
    local s = parse_state(redis.call('GET', p.key), p.fp, 3, p.key)
    if s and s.err then return s end
    if not s then return {updated = 0, w = -1, n = 0} end
    return {updated = s[1], w = s[2], n = s[3]}
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
  write = function(p, st, now, r, ttl)
    store(p.key, p.fp .. '|' .. int(now) .. '|' .. int(r.w) .. '|' .. int(r.n), ttl)
  end,
}
