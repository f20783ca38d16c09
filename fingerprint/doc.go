/*
Package fingerprint computes the fingerprint of an idempotent request.

idem stores the fingerprint of a request together with its idempotency key.
A retry that reuses the key must carry a request with the same fingerprint;
otherwise it is a different request under a reused key, and it is rejected.

# Fingerprint

A fingerprint is Size (33) bytes: the Version byte, followed by the SHA-256
digest of the request encoded with proto.MarshalOptions{Deterministic: true}
after its excluded fields have been cleared. The Version byte names the
algorithm, so that fingerprints stored before a change to it can be told
apart from fingerprints computed after it.

Compute a fingerprint with Sum, or with a Hasher from NewHasher when options
are needed:

	fp, err := fingerprint.Sum(req)

Sum returns an error for a nil request and for one that cannot be encoded.
Neither Sum nor Hasher.Sum ever modifies the request.

# Excluded fields

Fields that may change between retries of the same request, such as a trace
id or a client timestamp, are excluded in the .proto file:

	string trace_id = 5 [(idem.v1.field).fingerprint_exclude = true];

A marked field is excluded wherever its message appears in the request: at
the top level, in a nested message, in a list element or in a map value. For
messages whose .proto file cannot be annotated, name the fields with
WithExcludedFields. A field that carries the call's idempotency key,
marked (idem.v1.field).key = true, is excluded too: it names the request,
it is not part of it. By default, only the marked fields are excluded.

Excluding costs nothing for message types that cannot hold an excluded
field. A request of another type in which no excluded field is set costs
only a look at the fields that could hold one, and is encoded as it is.
Otherwise the excluded fields are cleared on a copy of the request
(proto.Clone), which is encoded instead, at the cost of that copy. The
request itself is never modified.

# What counts as the same request

Two requests have the same fingerprint when their encodings, without the
excluded fields, are equal. In particular:

  - Known fields are encoded in field-number order, so the order in which
    they arrived on the wire does not matter. Neither does whether a
    repeated scalar field arrived packed or unpacked.
  - A proto3 field without presence that is omitted equals one sent with its
    default value (0, "", false, empty bytes, the zero enum value): neither
    is encoded.
  - A proto3 optional field keeps its presence: an explicit 0 differs from
    an absent value. Likewise an empty message differs from an unset one.
  - Map entries are sorted by key, so the order of a map does not matter.
    The order of a repeated field does: [1, 2] differs from [2, 1].
  - Unknown fields, which the server's schema does not declare, are
    included as received, in the order received.
  - A google.protobuf.Any is hashed as its type URL and encoded bytes; the
    message packed inside is neither decoded nor stripped.
  - Headers are never part of the fingerprint: the caller passes only the
    request message.

Deterministic encoding is stable for a given build, but the protobuf
runtime does not promise the same bytes across its versions. The tests of
this package pin the fingerprints of fixed messages, so that a dependency
upgrade that changes them is noticed; an intentional change to the
algorithm comes with a new Version.
*/
package fingerprint
