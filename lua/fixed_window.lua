-- turnstile: fixed window (id 4). Window index w = floor(now / P) from the epoch.
--
-- State at KEY: "alg.L.P.B|updated_ms|n", n the units admitted in updated_ms's window
-- w = floor(updated_ms / P).

MAKE[4] = function() return {
  fresh = function() return {updated = 0, w = -1, n = 0} end,
  parse = function(q, updated, n)
    -- Never more than L.
    if n > q.L then return nil end
    return {updated = updated, w = divmod(updated, q.P), n = n}
  end,
  -- Writes retry (-1: never), remaining and reset, in whole ms.
  decide = function(p, st, now, c, out, o)
    local L, P = p.L, p.P
    local e = now % P
    local w = (now - e) / P
    local n = 0
    if st.w == w then n = st.n end
    local retry, k = -1, n
    if c == 0 then
      retry = 0
    elseif c <= L then
      if n <= L - c then
        retry, k = 0, n + c
        p.w, p.n = w, k
      else
        retry = P - e
      end
    end
    -- reset_after: to the window's end once anything is counted in it
    local reset = 0
    if k > 0 then reset = P - e end
    local rem = L - k
    if rem < 0 then rem = 0 end
    out[o + 1], out[o + 2], out[o + 3] = retry, rem, reset
    return retry == 0, reset
  end,
  -- In place: st (in p's terms, read by this call only) is not used again.
  admitted = function(p, st, now)
    st.updated, st.w, st.n = now, p.w, p.n
    return st
  end,
  refund = function(p, st, now, c)
    local w = divmod(now, p.P)
    if st.w ~= w then return nil end
    local n = st.n - c
    if n < 0 then n = 0 end
    return {updated = now, w = w, n = n}
  end,
  encode = function(params, st) return format('%s|%d|%d', params, st.updated, st.n) end,
} end
