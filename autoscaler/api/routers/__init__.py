"""The API's routers, one per kind of caller: `public` (no key), `worker` (a worker token),
`hand_made` (an enrolment key), `admin` and `dashboard` (an admin key)."""
