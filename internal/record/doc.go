/*
Package record encodes and decodes the body of a recorded outcome: what a
store keeps under a recorded key (store.Outcome.Body, opaque to the
stores) and what a replay answers from. It knows no transport: codes are
google.rpc.Code, which gRPC and Connect share, and metadata is a plain
map[string][]string with lowercase names, to which gRPC's metadata.MD,
net/http's Header and grpc-gateway's metadata all convert.

# The body

A body is the byte 0x02 followed by the encoding of an idem.record.v1.Record
(internal/proto/idem/record/v1/record.proto): the status code, the payload
(the deterministic encoding of the response for code 0, else of the
error's google.rpc.Status), the response header and trailer entries the
handler set, for methods that keep it the request (EncodeRequest; replays
never send it), and a CRC-32C checksum. Encode and EncodeRequest write
it, Decode reads it; no other code does.

	body, payload, err := record.Encode(code.Code_OK, resp, header, trailer)
	...
	r, err := record.Decode(body)

The checksum covers the code, the payload, the metadata and the request, so a body
corrupted in storage or in transit is refused, never replayed. Only metadata
that a replay may send again is kept (not grpc- names, pseudo-headers, the
content type, te, user-agent or idem's own headers), under its lowercase
name; Decode applies the same rule to what it reads.

# Earlier bodies

Decode also reads what earlier versions of idem recorded, which stores may
still hold until those keys expire:

  - the envelope 0x00 | code | CRC-32C of code and payload | payload,
  - the envelope with metadata 0x01 | code | CRC-32C of code and what
    follows | uvarint length of the metadata | metadata | payload,
  - a bare payload, recorded before any envelope existed.

No protobuf encoding starts with 0x00, 0x01 or 0x02 (field number 0 is
invalid), so the forms cannot be mistaken for one another. A bare payload
has no code and no checksum: Decode returns it with Bare set, and the
caller takes the code from elsewhere (the key's row) and must decode the
payload strictly, as nothing vouches for it. The reader of the two
envelopes is hand-written because they were; it can go once no store holds
them.
*/
package record
