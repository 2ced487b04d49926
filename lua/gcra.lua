-- turnstile: GCRA (id 2), the generic cell rate algorithm with emission interval T = P / L
-- and tolerance (B - 1) * T.
--
-- State at KEY: "fp|updated_ms|tat_ms|tat_frac": the theoretical arrival time
-- TAT = tat_ms + tat_frac / L ms, kept exactly. It is compared with now relative to now
-- (D = (TAT - now) * L, at most B * P), never as an absolute time times L, which would
-- leave the exact range of doubles. A request of cost c conforms iff
-- TAT - (B - c) * T <= now; the TAT then moves to max(TAT, now) + c * T.

ALG[2] = {
  read = function(p, now)
    local s = parse_state(redis.call('GET', p.key), p.fp, 3, p.key)
    if s and s.err then return s end
    if not s then return {updated = 0, tat_ms = 0, frac = 0} end
    if s[3] >= p.L then return redis.error_reply('TURNSTILE_INVALID_STATE invalid state at ' .. p.key) end
    return {updated = s[1], tat_ms = s[2], frac = s[3]}
  end,
  decide = function(p, st, now, c)
    local D = 0
    if st.tat_ms >= now then
      local ahead = st.tat_ms - now
      if ahead > p.B * p.P then ahead = p.B * p.P end -- keeps ahead * L below 2^53 too
      D = ahead * p.L + st.frac
      if D > p.B * p.P then D = p.B * p.P end
    end
    return debt_decide(p, D, c, false)
  end,
  write = function(p, st, now, r, ttl)
    local q, f = divmod(r.after, p.L)
    store(p.key, p.fp .. '|' .. int(now) .. '|' .. int(now + q) .. '|' .. int(f), ttl)
  end,
}
