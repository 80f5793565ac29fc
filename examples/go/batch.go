package main

// A record-batch encoder written from docs/record-batch.md alone (the
// format's contract), for clients that speak the batch-level Log service:
// a 61-byte big-endian header with a CRC32C (Castagnoli) of bytes [21, end),
// then a columnar little-endian body. Uncompressed, not idempotent.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Header is one record header; a nil Value is a null value.
type Header struct {
	Key   string
	Value []byte
}

// BatchRecord is one record to encode; a nil Key or Value is null.
type BatchRecord struct {
	Key         []byte
	Value       []byte
	Headers     []Header
	TimestampMs int64
}

const (
	headerSize      = 61
	magic           = 1
	crcStart        = 21 // the CRC covers bytes [21, end)
	flagTimestamps  = 0x02
	flagHeaders     = 0x04
	nullLengthLE    = math.MaxUint32 // an int32 length of -1: null
	maxHeaderKeyLen = math.MaxUint16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodeBatch encodes records as one batch with dense offsets (no
// OFFSET_DELTAS column), a TIMESTAMPS column (base_timestamp is the first
// record's, max_timestamp the largest) and, when any record has headers, a
// HEADERS column in which a record without headers has an empty block.
func EncodeBatch(records []BatchRecord) ([]byte, error) {
	n := len(records)
	if n == 0 {
		return nil, errors.New("a batch holds at least one record")
	}
	withHeaders := false
	for _, r := range records {
		withHeaders = withHeaders || len(r.Headers) > 0
	}
	flags := byte(flagTimestamps)
	if withHeaders {
		flags |= flagHeaders
	}

	le := binary.LittleEndian
	body := []byte{flags}
	maxTs := records[0].TimestampMs
	for _, r := range records {
		body = le.AppendUint64(body, uint64(r.TimestampMs))
		maxTs = max(maxTs, r.TimestampMs)
	}
	appendLength := func(b []byte, field []byte) []byte {
		if field == nil {
			return le.AppendUint32(b, nullLengthLE)
		}
		return le.AppendUint32(b, uint32(len(field)))
	}
	for _, r := range records {
		body = appendLength(body, r.Key)
	}
	for _, r := range records {
		body = appendLength(body, r.Value)
	}
	var blocks [][]byte
	if withHeaders {
		for _, r := range records {
			block, err := headerBlock(r.Headers)
			if err != nil {
				return nil, err
			}
			blocks = append(blocks, block)
			body = le.AppendUint32(body, uint32(len(block)))
		}
	}
	for _, r := range records {
		body = append(body, r.Key...)
	}
	for _, r := range records {
		body = append(body, r.Value...)
	}
	for _, block := range blocks {
		body = append(body, block...)
	}

	be := binary.BigEndian
	batch := make([]byte, 0, headerSize+len(body))
	batch = be.AppendUint64(batch, 0)                               // base_offset: the broker's
	batch = be.AppendUint32(batch, uint32(headerSize-12+len(body))) // batch_length
	batch = be.AppendUint32(batch, math.MaxUint32)                  // partition_leader_epoch -1
	batch = append(batch, magic)
	batch = be.AppendUint32(batch, 0)           // crc, set below
	batch = be.AppendUint16(batch, 0)           // attributes: no codec, CreateTime
	batch = be.AppendUint32(batch, uint32(n-1)) // last_offset_delta
	batch = be.AppendUint64(batch, uint64(records[0].TimestampMs))
	batch = be.AppendUint64(batch, uint64(maxTs))
	batch = be.AppendUint64(batch, math.MaxUint64) // producer_id -1
	batch = be.AppendUint16(batch, math.MaxUint16) // producer_epoch -1
	batch = be.AppendUint32(batch, math.MaxUint32) // base_sequence -1
	batch = be.AppendUint32(batch, uint32(n))      // record_count
	batch = append(batch, body...)
	be.PutUint32(batch[17:21], crc32.Checksum(batch[crcStart:], castagnoli))
	return batch, nil
}

// headerBlock: u16 count, then per header u16 key length, the UTF-8 key,
// int32 value length (-1 null) and the value; empty for no headers.
func headerBlock(headers []Header) ([]byte, error) {
	if len(headers) == 0 {
		return nil, nil
	}
	if len(headers) > math.MaxUint16 {
		return nil, fmt.Errorf("%d headers: at most %d per record", len(headers), math.MaxUint16)
	}
	le := binary.LittleEndian
	block := le.AppendUint16(nil, uint16(len(headers)))
	for _, h := range headers {
		if len(h.Key) > maxHeaderKeyLen {
			return nil, fmt.Errorf("header key of %d bytes: at most %d", len(h.Key), maxHeaderKeyLen)
		}
		block = le.AppendUint16(block, uint16(len(h.Key)))
		block = append(block, h.Key...)
		if h.Value == nil {
			block = le.AppendUint32(block, nullLengthLE)
		} else {
			block = le.AppendUint32(block, uint32(len(h.Value)))
			block = append(block, h.Value...)
		}
	}
	return block, nil
}
