// viewer.js: generated from js/src by `npm run build` (agui-hub); do not edit.
var __defProp = Object.defineProperty;
var __export = (target, all) => {
  for (var name in all)
    __defProp(target, name, { get: all[name], enumerable: true });
};

// node_modules/@msgpack/msgpack/dist.esm/utils/utf8.mjs
function utf8Count(str2) {
  const strLength = str2.length;
  let byteLength = 0;
  let pos = 0;
  while (pos < strLength) {
    let value = str2.charCodeAt(pos++);
    if ((value & 4294967168) === 0) {
      byteLength++;
      continue;
    } else if ((value & 4294965248) === 0) {
      byteLength += 2;
    } else {
      if (value >= 55296 && value <= 56319) {
        if (pos < strLength) {
          const extra = str2.charCodeAt(pos);
          if ((extra & 64512) === 56320) {
            ++pos;
            value = ((value & 1023) << 10) + (extra & 1023) + 65536;
          }
        }
      }
      if ((value & 4294901760) === 0) {
        byteLength += 3;
      } else {
        byteLength += 4;
      }
    }
  }
  return byteLength;
}
function utf8EncodeJs(str2, output, outputOffset) {
  const strLength = str2.length;
  let offset = outputOffset;
  let pos = 0;
  while (pos < strLength) {
    let value = str2.charCodeAt(pos++);
    if ((value & 4294967168) === 0) {
      output[offset++] = value;
      continue;
    } else if ((value & 4294965248) === 0) {
      output[offset++] = value >> 6 & 31 | 192;
    } else {
      if (value >= 55296 && value <= 56319) {
        if (pos < strLength) {
          const extra = str2.charCodeAt(pos);
          if ((extra & 64512) === 56320) {
            ++pos;
            value = ((value & 1023) << 10) + (extra & 1023) + 65536;
          }
        }
      }
      if ((value & 4294901760) === 0) {
        output[offset++] = value >> 12 & 15 | 224;
        output[offset++] = value >> 6 & 63 | 128;
      } else {
        output[offset++] = value >> 18 & 7 | 240;
        output[offset++] = value >> 12 & 63 | 128;
        output[offset++] = value >> 6 & 63 | 128;
      }
    }
    output[offset++] = value & 63 | 128;
  }
}
var sharedTextEncoder = new TextEncoder();
var TEXT_ENCODER_THRESHOLD = 50;
function utf8EncodeTE(str2, output, outputOffset) {
  sharedTextEncoder.encodeInto(str2, output.subarray(outputOffset));
}
function utf8Encode(str2, output, outputOffset) {
  if (str2.length > TEXT_ENCODER_THRESHOLD) {
    utf8EncodeTE(str2, output, outputOffset);
  } else {
    utf8EncodeJs(str2, output, outputOffset);
  }
}
var CHUNK_SIZE = 4096;
function utf8DecodeJs(bytes, inputOffset, byteLength) {
  let offset = inputOffset;
  const end = offset + byteLength;
  const units = [];
  let result = "";
  while (offset < end) {
    const byte1 = bytes[offset++];
    if ((byte1 & 128) === 0) {
      units.push(byte1);
    } else if ((byte1 & 224) === 192) {
      const byte2 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 6 | byte2);
    } else if ((byte1 & 240) === 224) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 12 | byte2 << 6 | byte3);
    } else if ((byte1 & 248) === 240) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      const byte4 = bytes[offset++] & 63;
      let unit = (byte1 & 7) << 18 | byte2 << 12 | byte3 << 6 | byte4;
      if (unit > 65535) {
        unit -= 65536;
        units.push(unit >>> 10 & 1023 | 55296);
        unit = 56320 | unit & 1023;
      }
      units.push(unit);
    } else {
      units.push(byte1);
    }
    if (units.length >= CHUNK_SIZE) {
      result += String.fromCharCode(...units);
      units.length = 0;
    }
  }
  if (units.length > 0) {
    result += String.fromCharCode(...units);
  }
  return result;
}
var sharedTextDecoder = new TextDecoder();
var TEXT_DECODER_THRESHOLD = 200;
function utf8DecodeTD(bytes, inputOffset, byteLength) {
  const stringBytes = bytes.subarray(inputOffset, inputOffset + byteLength);
  return sharedTextDecoder.decode(stringBytes);
}
function utf8Decode(bytes, inputOffset, byteLength) {
  if (byteLength > TEXT_DECODER_THRESHOLD) {
    return utf8DecodeTD(bytes, inputOffset, byteLength);
  } else {
    return utf8DecodeJs(bytes, inputOffset, byteLength);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/ExtData.mjs
var ExtData = class {
  type;
  data;
  constructor(type, data) {
    this.type = type;
    this.data = data;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/DecodeError.mjs
var DecodeError = class _DecodeError extends Error {
  constructor(message) {
    super(message);
    const proto = Object.create(_DecodeError.prototype);
    Object.setPrototypeOf(this, proto);
    Object.defineProperty(this, "name", {
      configurable: true,
      enumerable: false,
      value: _DecodeError.name
    });
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/int.mjs
var UINT32_MAX = 4294967295;
function setUint64(view, offset, value) {
  const high = value / 4294967296;
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function setInt64(view, offset, value) {
  const high = Math.floor(value / 4294967296);
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function getInt64(view, offset) {
  const high = view.getInt32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}
function getUint64(view, offset) {
  const high = view.getUint32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}

// node_modules/@msgpack/msgpack/dist.esm/timestamp.mjs
var EXT_TIMESTAMP = -1;
var TIMESTAMP32_MAX_SEC = 4294967296 - 1;
var TIMESTAMP64_MAX_SEC = 17179869184 - 1;
function encodeTimeSpecToTimestamp({ sec, nsec }) {
  if (sec >= 0 && nsec >= 0 && sec <= TIMESTAMP64_MAX_SEC) {
    if (nsec === 0 && sec <= TIMESTAMP32_MAX_SEC) {
      const rv = new Uint8Array(4);
      const view = new DataView(rv.buffer);
      view.setUint32(0, sec);
      return rv;
    } else {
      const secHigh = sec / 4294967296;
      const secLow = sec & 4294967295;
      const rv = new Uint8Array(8);
      const view = new DataView(rv.buffer);
      view.setUint32(0, nsec << 2 | secHigh & 3);
      view.setUint32(4, secLow);
      return rv;
    }
  } else {
    const rv = new Uint8Array(12);
    const view = new DataView(rv.buffer);
    view.setUint32(0, nsec);
    setInt64(view, 4, sec);
    return rv;
  }
}
function encodeDateToTimeSpec(date) {
  const msec = date.getTime();
  const sec = Math.floor(msec / 1e3);
  const nsec = (msec - sec * 1e3) * 1e6;
  const nsecInSec = Math.floor(nsec / 1e9);
  return {
    sec: sec + nsecInSec,
    nsec: nsec - nsecInSec * 1e9
  };
}
function encodeTimestampExtension(object) {
  if (object instanceof Date) {
    const timeSpec = encodeDateToTimeSpec(object);
    return encodeTimeSpecToTimestamp(timeSpec);
  } else {
    return null;
  }
}
function decodeTimestampToTimeSpec(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  switch (data.byteLength) {
    case 4: {
      const sec = view.getUint32(0);
      const nsec = 0;
      return { sec, nsec };
    }
    case 8: {
      const nsec30AndSecHigh2 = view.getUint32(0);
      const secLow32 = view.getUint32(4);
      const sec = (nsec30AndSecHigh2 & 3) * 4294967296 + secLow32;
      const nsec = nsec30AndSecHigh2 >>> 2;
      return { sec, nsec };
    }
    case 12: {
      const sec = getInt64(view, 4);
      const nsec = view.getUint32(0);
      return { sec, nsec };
    }
    default:
      throw new DecodeError(`Unrecognized data size for timestamp (expected 4, 8, or 12): ${data.length}`);
  }
}
function decodeTimestampExtension(data) {
  const timeSpec = decodeTimestampToTimeSpec(data);
  return new Date(timeSpec.sec * 1e3 + timeSpec.nsec / 1e6);
}
var timestampExtension = {
  type: EXT_TIMESTAMP,
  encode: encodeTimestampExtension,
  decode: decodeTimestampExtension
};

// node_modules/@msgpack/msgpack/dist.esm/ExtensionCodec.mjs
var ExtensionCodec = class _ExtensionCodec {
  static defaultCodec = new _ExtensionCodec();
  // ensures ExtensionCodecType<X> matches ExtensionCodec<X>
  // this will make type errors a lot more clear
  // eslint-disable-next-line @typescript-eslint/naming-convention
  __brand;
  // built-in extensions
  builtInEncoders = [];
  builtInDecoders = [];
  // custom extensions
  encoders = [];
  decoders = [];
  constructor() {
    this.register(timestampExtension);
  }
  register({ type, encode, decode }) {
    if (type >= 0) {
      this.encoders[type] = encode;
      this.decoders[type] = decode;
    } else {
      const index = -1 - type;
      this.builtInEncoders[index] = encode;
      this.builtInDecoders[index] = decode;
    }
  }
  tryToEncode(object, context) {
    for (let i = 0; i < this.builtInEncoders.length; i++) {
      const encodeExt = this.builtInEncoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = -1 - i;
          return new ExtData(type, data);
        }
      }
    }
    for (let i = 0; i < this.encoders.length; i++) {
      const encodeExt = this.encoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = i;
          return new ExtData(type, data);
        }
      }
    }
    if (object instanceof ExtData) {
      return object;
    }
    return null;
  }
  decode(data, type, context) {
    const decodeExt = type < 0 ? this.builtInDecoders[-1 - type] : this.decoders[type];
    if (decodeExt) {
      return decodeExt(data, type, context);
    } else {
      return new ExtData(type, data);
    }
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/typedArrays.mjs
function isArrayBufferLike(buffer) {
  return buffer instanceof ArrayBuffer || typeof SharedArrayBuffer !== "undefined" && buffer instanceof SharedArrayBuffer;
}
function ensureUint8Array(buffer) {
  if (buffer instanceof Uint8Array) {
    return buffer;
  } else if (ArrayBuffer.isView(buffer)) {
    return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  } else if (isArrayBufferLike(buffer)) {
    return new Uint8Array(buffer);
  } else {
    return Uint8Array.from(buffer);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/Encoder.mjs
var DEFAULT_MAX_DEPTH = 100;
var DEFAULT_INITIAL_BUFFER_SIZE = 2048;
var Encoder = class _Encoder {
  extensionCodec;
  context;
  useBigInt64;
  maxDepth;
  initialBufferSize;
  sortKeys;
  forceFloat32;
  ignoreUndefined;
  forceIntegerToFloat;
  pos;
  view;
  bytes;
  entered = false;
  constructor(options) {
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.maxDepth = options?.maxDepth ?? DEFAULT_MAX_DEPTH;
    this.initialBufferSize = options?.initialBufferSize ?? DEFAULT_INITIAL_BUFFER_SIZE;
    this.sortKeys = options?.sortKeys ?? false;
    this.forceFloat32 = options?.forceFloat32 ?? false;
    this.ignoreUndefined = options?.ignoreUndefined ?? false;
    this.forceIntegerToFloat = options?.forceIntegerToFloat ?? false;
    this.pos = 0;
    this.view = new DataView(new ArrayBuffer(this.initialBufferSize));
    this.bytes = new Uint8Array(this.view.buffer);
  }
  clone() {
    return new _Encoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      maxDepth: this.maxDepth,
      initialBufferSize: this.initialBufferSize,
      sortKeys: this.sortKeys,
      forceFloat32: this.forceFloat32,
      ignoreUndefined: this.ignoreUndefined,
      forceIntegerToFloat: this.forceIntegerToFloat
    });
  }
  reinitializeState() {
    this.pos = 0;
  }
  /**
   * This is almost equivalent to {@link Encoder#encode}, but it returns an reference of the encoder's internal buffer and thus much faster than {@link Encoder#encode}.
   *
   * @returns Encodes the object and returns a shared reference the encoder's internal buffer.
   */
  encodeSharedRef(object) {
    if (this.entered) {
      const instance = this.clone();
      return instance.encodeSharedRef(object);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.doEncode(object, 1);
      return this.bytes.subarray(0, this.pos);
    } finally {
      this.entered = false;
    }
  }
  /**
   * @returns Encodes the object and returns a copy of the encoder's internal buffer.
   */
  encode(object) {
    if (this.entered) {
      const instance = this.clone();
      return instance.encode(object);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.doEncode(object, 1);
      return this.bytes.slice(0, this.pos);
    } finally {
      this.entered = false;
    }
  }
  doEncode(object, depth) {
    if (depth > this.maxDepth) {
      throw new Error(`Too deep objects in depth ${depth}`);
    }
    if (object == null) {
      this.encodeNil();
    } else if (typeof object === "boolean") {
      this.encodeBoolean(object);
    } else if (typeof object === "number") {
      if (!this.forceIntegerToFloat) {
        this.encodeNumber(object);
      } else {
        this.encodeNumberAsFloat(object);
      }
    } else if (typeof object === "string") {
      this.encodeString(object);
    } else if (this.useBigInt64 && typeof object === "bigint") {
      this.encodeBigInt64(object);
    } else {
      this.encodeObject(object, depth);
    }
  }
  ensureBufferSizeToWrite(sizeToWrite) {
    const requiredSize = this.pos + sizeToWrite;
    if (this.view.byteLength < requiredSize) {
      this.resizeBuffer(requiredSize * 2);
    }
  }
  resizeBuffer(newSize) {
    const newBuffer = new ArrayBuffer(newSize);
    const newBytes = new Uint8Array(newBuffer);
    const newView = new DataView(newBuffer);
    newBytes.set(this.bytes);
    this.view = newView;
    this.bytes = newBytes;
  }
  encodeNil() {
    this.writeU8(192);
  }
  encodeBoolean(object) {
    if (object === false) {
      this.writeU8(194);
    } else {
      this.writeU8(195);
    }
  }
  encodeNumber(object) {
    if (!this.forceIntegerToFloat && Number.isSafeInteger(object)) {
      if (object >= 0) {
        if (object < 128) {
          this.writeU8(object);
        } else if (object < 256) {
          this.writeU8(204);
          this.writeU8(object);
        } else if (object < 65536) {
          this.writeU8(205);
          this.writeU16(object);
        } else if (object < 4294967296) {
          this.writeU8(206);
          this.writeU32(object);
        } else if (!this.useBigInt64) {
          this.writeU8(207);
          this.writeU64(object);
        } else {
          this.encodeNumberAsFloat(object);
        }
      } else {
        if (object >= -32) {
          this.writeU8(224 | object + 32);
        } else if (object >= -128) {
          this.writeU8(208);
          this.writeI8(object);
        } else if (object >= -32768) {
          this.writeU8(209);
          this.writeI16(object);
        } else if (object >= -2147483648) {
          this.writeU8(210);
          this.writeI32(object);
        } else if (!this.useBigInt64) {
          this.writeU8(211);
          this.writeI64(object);
        } else {
          this.encodeNumberAsFloat(object);
        }
      }
    } else {
      this.encodeNumberAsFloat(object);
    }
  }
  encodeNumberAsFloat(object) {
    if (this.forceFloat32) {
      this.writeU8(202);
      this.writeF32(object);
    } else {
      this.writeU8(203);
      this.writeF64(object);
    }
  }
  encodeBigInt64(object) {
    if (object >= BigInt(0)) {
      this.writeU8(207);
      this.writeBigUint64(object);
    } else {
      this.writeU8(211);
      this.writeBigInt64(object);
    }
  }
  writeStringHeader(byteLength) {
    if (byteLength < 32) {
      this.writeU8(160 + byteLength);
    } else if (byteLength < 256) {
      this.writeU8(217);
      this.writeU8(byteLength);
    } else if (byteLength < 65536) {
      this.writeU8(218);
      this.writeU16(byteLength);
    } else if (byteLength < 4294967296) {
      this.writeU8(219);
      this.writeU32(byteLength);
    } else {
      throw new Error(`Too long string: ${byteLength} bytes in UTF-8`);
    }
  }
  encodeString(object) {
    const maxHeaderSize = 1 + 4;
    const byteLength = utf8Count(object);
    this.ensureBufferSizeToWrite(maxHeaderSize + byteLength);
    this.writeStringHeader(byteLength);
    utf8Encode(object, this.bytes, this.pos);
    this.pos += byteLength;
  }
  encodeObject(object, depth) {
    const ext = this.extensionCodec.tryToEncode(object, this.context);
    if (ext != null) {
      this.encodeExtension(ext);
    } else if (Array.isArray(object)) {
      this.encodeArray(object, depth);
    } else if (ArrayBuffer.isView(object)) {
      this.encodeBinary(object);
    } else if (typeof object === "object") {
      this.encodeMap(object, depth);
    } else {
      throw new Error(`Unrecognized object: ${Object.prototype.toString.apply(object)}`);
    }
  }
  encodeBinary(object) {
    const size = object.byteLength;
    if (size < 256) {
      this.writeU8(196);
      this.writeU8(size);
    } else if (size < 65536) {
      this.writeU8(197);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(198);
      this.writeU32(size);
    } else {
      throw new Error(`Too large binary: ${size}`);
    }
    const bytes = ensureUint8Array(object);
    this.writeU8a(bytes);
  }
  encodeArray(object, depth) {
    const size = object.length;
    if (size < 16) {
      this.writeU8(144 + size);
    } else if (size < 65536) {
      this.writeU8(220);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(221);
      this.writeU32(size);
    } else {
      throw new Error(`Too large array: ${size}`);
    }
    for (const item of object) {
      this.doEncode(item, depth + 1);
    }
  }
  countWithoutUndefined(object, keys) {
    let count = 0;
    for (const key of keys) {
      if (object[key] !== void 0) {
        count++;
      }
    }
    return count;
  }
  encodeMap(object, depth) {
    const keys = Object.keys(object);
    if (this.sortKeys) {
      keys.sort();
    }
    const size = this.ignoreUndefined ? this.countWithoutUndefined(object, keys) : keys.length;
    if (size < 16) {
      this.writeU8(128 + size);
    } else if (size < 65536) {
      this.writeU8(222);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(223);
      this.writeU32(size);
    } else {
      throw new Error(`Too large map object: ${size}`);
    }
    for (const key of keys) {
      const value = object[key];
      if (!(this.ignoreUndefined && value === void 0)) {
        this.encodeString(key);
        this.doEncode(value, depth + 1);
      }
    }
  }
  encodeExtension(ext) {
    if (typeof ext.data === "function") {
      const data = ext.data(this.pos + 6);
      const size2 = data.length;
      if (size2 >= 4294967296) {
        throw new Error(`Too large extension object: ${size2}`);
      }
      this.writeU8(201);
      this.writeU32(size2);
      this.writeI8(ext.type);
      this.writeU8a(data);
      return;
    }
    const size = ext.data.length;
    if (size === 1) {
      this.writeU8(212);
    } else if (size === 2) {
      this.writeU8(213);
    } else if (size === 4) {
      this.writeU8(214);
    } else if (size === 8) {
      this.writeU8(215);
    } else if (size === 16) {
      this.writeU8(216);
    } else if (size < 256) {
      this.writeU8(199);
      this.writeU8(size);
    } else if (size < 65536) {
      this.writeU8(200);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(201);
      this.writeU32(size);
    } else {
      throw new Error(`Too large extension object: ${size}`);
    }
    this.writeI8(ext.type);
    this.writeU8a(ext.data);
  }
  writeU8(value) {
    this.ensureBufferSizeToWrite(1);
    this.view.setUint8(this.pos, value);
    this.pos++;
  }
  writeU8a(values) {
    const size = values.length;
    this.ensureBufferSizeToWrite(size);
    this.bytes.set(values, this.pos);
    this.pos += size;
  }
  writeI8(value) {
    this.ensureBufferSizeToWrite(1);
    this.view.setInt8(this.pos, value);
    this.pos++;
  }
  writeU16(value) {
    this.ensureBufferSizeToWrite(2);
    this.view.setUint16(this.pos, value);
    this.pos += 2;
  }
  writeI16(value) {
    this.ensureBufferSizeToWrite(2);
    this.view.setInt16(this.pos, value);
    this.pos += 2;
  }
  writeU32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setUint32(this.pos, value);
    this.pos += 4;
  }
  writeI32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setInt32(this.pos, value);
    this.pos += 4;
  }
  writeF32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setFloat32(this.pos, value);
    this.pos += 4;
  }
  writeF64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setFloat64(this.pos, value);
    this.pos += 8;
  }
  writeU64(value) {
    this.ensureBufferSizeToWrite(8);
    setUint64(this.view, this.pos, value);
    this.pos += 8;
  }
  writeI64(value) {
    this.ensureBufferSizeToWrite(8);
    setInt64(this.view, this.pos, value);
    this.pos += 8;
  }
  writeBigUint64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setBigUint64(this.pos, value);
    this.pos += 8;
  }
  writeBigInt64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setBigInt64(this.pos, value);
    this.pos += 8;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/prettyByte.mjs
function prettyByte(byte) {
  return `${byte < 0 ? "-" : ""}0x${Math.abs(byte).toString(16).padStart(2, "0")}`;
}

// node_modules/@msgpack/msgpack/dist.esm/CachedKeyDecoder.mjs
var DEFAULT_MAX_KEY_LENGTH = 16;
var DEFAULT_MAX_LENGTH_PER_KEY = 16;
var CachedKeyDecoder = class {
  hit = 0;
  miss = 0;
  caches;
  maxKeyLength;
  maxLengthPerKey;
  constructor(maxKeyLength = DEFAULT_MAX_KEY_LENGTH, maxLengthPerKey = DEFAULT_MAX_LENGTH_PER_KEY) {
    this.maxKeyLength = maxKeyLength;
    this.maxLengthPerKey = maxLengthPerKey;
    this.caches = [];
    for (let i = 0; i < this.maxKeyLength; i++) {
      this.caches.push([]);
    }
  }
  canBeCached(byteLength) {
    return byteLength > 0 && byteLength <= this.maxKeyLength;
  }
  find(bytes, inputOffset, byteLength) {
    const records = this.caches[byteLength - 1];
    FIND_CHUNK: for (const record of records) {
      const recordBytes = record.bytes;
      for (let j = 0; j < byteLength; j++) {
        if (recordBytes[j] !== bytes[inputOffset + j]) {
          continue FIND_CHUNK;
        }
      }
      return record.str;
    }
    return null;
  }
  store(bytes, value) {
    const records = this.caches[bytes.length - 1];
    const record = { bytes, str: value };
    if (records.length >= this.maxLengthPerKey) {
      records[Math.random() * records.length | 0] = record;
    } else {
      records.push(record);
    }
  }
  decode(bytes, inputOffset, byteLength) {
    const cachedValue = this.find(bytes, inputOffset, byteLength);
    if (cachedValue != null) {
      this.hit++;
      return cachedValue;
    }
    this.miss++;
    const str2 = utf8DecodeJs(bytes, inputOffset, byteLength);
    const slicedCopyOfBytes = Uint8Array.prototype.slice.call(bytes, inputOffset, inputOffset + byteLength);
    this.store(slicedCopyOfBytes, str2);
    return str2;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/Decoder.mjs
var STATE_ARRAY = "array";
var STATE_MAP_KEY = "map_key";
var STATE_MAP_VALUE = "map_value";
var mapKeyConverter = (key) => {
  if (typeof key === "string" || typeof key === "number") {
    return key;
  }
  throw new DecodeError("The type of key must be string or number but " + typeof key);
};
var StackPool = class {
  stack = [];
  stackHeadPosition = -1;
  get length() {
    return this.stackHeadPosition + 1;
  }
  top() {
    return this.stack[this.stackHeadPosition];
  }
  pushArrayState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_ARRAY;
    state.position = 0;
    state.size = size;
    state.array = new Array(size);
  }
  pushMapState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_MAP_KEY;
    state.readCount = 0;
    state.size = size;
    state.map = {};
  }
  getUninitializedStateFromPool() {
    this.stackHeadPosition++;
    if (this.stackHeadPosition === this.stack.length) {
      const partialState = {
        type: void 0,
        size: 0,
        array: void 0,
        position: 0,
        readCount: 0,
        map: void 0,
        key: null
      };
      this.stack.push(partialState);
    }
    return this.stack[this.stackHeadPosition];
  }
  release(state) {
    const topStackState = this.stack[this.stackHeadPosition];
    if (topStackState !== state) {
      throw new Error("Invalid stack state. Released state is not on top of the stack.");
    }
    if (state.type === STATE_ARRAY) {
      const partialState = state;
      partialState.size = 0;
      partialState.array = void 0;
      partialState.position = 0;
      partialState.type = void 0;
    }
    if (state.type === STATE_MAP_KEY || state.type === STATE_MAP_VALUE) {
      const partialState = state;
      partialState.size = 0;
      partialState.map = void 0;
      partialState.readCount = 0;
      partialState.type = void 0;
    }
    this.stackHeadPosition--;
  }
  reset() {
    this.stack.length = 0;
    this.stackHeadPosition = -1;
  }
};
var HEAD_BYTE_REQUIRED = -1;
var EMPTY_VIEW = new DataView(new ArrayBuffer(0));
var EMPTY_BYTES = new Uint8Array(EMPTY_VIEW.buffer);
try {
  EMPTY_VIEW.getInt8(0);
} catch (e) {
  if (!(e instanceof RangeError)) {
    throw new Error("This module is not supported in the current JavaScript engine because DataView does not throw RangeError on out-of-bounds access");
  }
}
var MORE_DATA = new RangeError("Insufficient data");
var sharedCachedKeyDecoder = new CachedKeyDecoder();
var Decoder = class _Decoder {
  extensionCodec;
  context;
  useBigInt64;
  rawStrings;
  maxStrLength;
  maxBinLength;
  maxArrayLength;
  maxMapLength;
  maxExtLength;
  keyDecoder;
  mapKeyConverter;
  totalPos = 0;
  pos = 0;
  view = EMPTY_VIEW;
  bytes = EMPTY_BYTES;
  headByte = HEAD_BYTE_REQUIRED;
  stack = new StackPool();
  entered = false;
  constructor(options) {
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.rawStrings = options?.rawStrings ?? false;
    this.maxStrLength = options?.maxStrLength ?? UINT32_MAX;
    this.maxBinLength = options?.maxBinLength ?? UINT32_MAX;
    this.maxArrayLength = options?.maxArrayLength ?? UINT32_MAX;
    this.maxMapLength = options?.maxMapLength ?? UINT32_MAX;
    this.maxExtLength = options?.maxExtLength ?? UINT32_MAX;
    this.keyDecoder = options?.keyDecoder !== void 0 ? options.keyDecoder : sharedCachedKeyDecoder;
    this.mapKeyConverter = options?.mapKeyConverter ?? mapKeyConverter;
  }
  clone() {
    return new _Decoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      rawStrings: this.rawStrings,
      maxStrLength: this.maxStrLength,
      maxBinLength: this.maxBinLength,
      maxArrayLength: this.maxArrayLength,
      maxMapLength: this.maxMapLength,
      maxExtLength: this.maxExtLength,
      keyDecoder: this.keyDecoder
    });
  }
  reinitializeState() {
    this.totalPos = 0;
    this.headByte = HEAD_BYTE_REQUIRED;
    this.stack.reset();
  }
  setBuffer(buffer) {
    const bytes = ensureUint8Array(buffer);
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  appendBuffer(buffer) {
    if (this.headByte === HEAD_BYTE_REQUIRED && !this.hasRemaining(1)) {
      this.setBuffer(buffer);
    } else {
      const remainingData = this.bytes.subarray(this.pos);
      const newData = ensureUint8Array(buffer);
      const newBuffer = new Uint8Array(remainingData.length + newData.length);
      newBuffer.set(remainingData);
      newBuffer.set(newData, remainingData.length);
      this.setBuffer(newBuffer);
    }
  }
  hasRemaining(size) {
    return this.view.byteLength - this.pos >= size;
  }
  createExtraByteError(posToShow) {
    const { view, pos } = this;
    return new RangeError(`Extra ${view.byteLength - pos} of ${view.byteLength} byte(s) found at buffer[${posToShow}]`);
  }
  /**
   * @throws {@link DecodeError}
   * @throws {@link RangeError}
   */
  decode(buffer) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decode(buffer);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      const object = this.doDecodeSync();
      if (this.hasRemaining(1)) {
        throw this.createExtraByteError(this.pos);
      }
      return object;
    } finally {
      this.entered = false;
    }
  }
  *decodeMulti(buffer) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMulti(buffer);
      return;
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      while (this.hasRemaining(1)) {
        yield this.doDecodeSync();
      }
    } finally {
      this.entered = false;
    }
  }
  async decodeAsync(stream) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decodeAsync(stream);
    }
    try {
      this.entered = true;
      let decoded = false;
      let object;
      for await (const buffer of stream) {
        if (decoded) {
          this.entered = false;
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        try {
          object = this.doDecodeSync();
          decoded = true;
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
      if (decoded) {
        if (this.hasRemaining(1)) {
          throw this.createExtraByteError(this.totalPos);
        }
        return object;
      }
      const { headByte, pos, totalPos } = this;
      throw new RangeError(`Insufficient data in parsing ${prettyByte(headByte)} at ${totalPos} (${pos} in the current buffer)`);
    } finally {
      this.entered = false;
    }
  }
  decodeArrayStream(stream) {
    return this.decodeMultiAsync(stream, true);
  }
  decodeStream(stream) {
    return this.decodeMultiAsync(stream, false);
  }
  async *decodeMultiAsync(stream, isArray) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMultiAsync(stream, isArray);
      return;
    }
    try {
      this.entered = true;
      let isArrayHeaderRequired = isArray;
      let arrayItemsLeft = -1;
      for await (const buffer of stream) {
        if (isArray && arrayItemsLeft === 0) {
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        if (isArrayHeaderRequired) {
          arrayItemsLeft = this.readArraySize();
          isArrayHeaderRequired = false;
          this.complete();
        }
        try {
          while (true) {
            yield this.doDecodeSync();
            if (--arrayItemsLeft === 0) {
              break;
            }
          }
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
    } finally {
      this.entered = false;
    }
  }
  doDecodeSync() {
    DECODE: while (true) {
      const headByte = this.readHeadByte();
      let object;
      if (headByte >= 224) {
        object = headByte - 256;
      } else if (headByte < 192) {
        if (headByte < 128) {
          object = headByte;
        } else if (headByte < 144) {
          const size = headByte - 128;
          if (size !== 0) {
            this.pushMapState(size);
            this.complete();
            continue DECODE;
          } else {
            object = {};
          }
        } else if (headByte < 160) {
          const size = headByte - 144;
          if (size !== 0) {
            this.pushArrayState(size);
            this.complete();
            continue DECODE;
          } else {
            object = [];
          }
        } else {
          const byteLength = headByte - 160;
          object = this.decodeString(byteLength, 0);
        }
      } else if (headByte === 192) {
        object = null;
      } else if (headByte === 194) {
        object = false;
      } else if (headByte === 195) {
        object = true;
      } else if (headByte === 202) {
        object = this.readF32();
      } else if (headByte === 203) {
        object = this.readF64();
      } else if (headByte === 204) {
        object = this.readU8();
      } else if (headByte === 205) {
        object = this.readU16();
      } else if (headByte === 206) {
        object = this.readU32();
      } else if (headByte === 207) {
        if (this.useBigInt64) {
          object = this.readU64AsBigInt();
        } else {
          object = this.readU64();
        }
      } else if (headByte === 208) {
        object = this.readI8();
      } else if (headByte === 209) {
        object = this.readI16();
      } else if (headByte === 210) {
        object = this.readI32();
      } else if (headByte === 211) {
        if (this.useBigInt64) {
          object = this.readI64AsBigInt();
        } else {
          object = this.readI64();
        }
      } else if (headByte === 217) {
        const byteLength = this.lookU8();
        object = this.decodeString(byteLength, 1);
      } else if (headByte === 218) {
        const byteLength = this.lookU16();
        object = this.decodeString(byteLength, 2);
      } else if (headByte === 219) {
        const byteLength = this.lookU32();
        object = this.decodeString(byteLength, 4);
      } else if (headByte === 220) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 221) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 222) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 223) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 196) {
        const size = this.lookU8();
        object = this.decodeBinary(size, 1);
      } else if (headByte === 197) {
        const size = this.lookU16();
        object = this.decodeBinary(size, 2);
      } else if (headByte === 198) {
        const size = this.lookU32();
        object = this.decodeBinary(size, 4);
      } else if (headByte === 212) {
        object = this.decodeExtension(1, 0);
      } else if (headByte === 213) {
        object = this.decodeExtension(2, 0);
      } else if (headByte === 214) {
        object = this.decodeExtension(4, 0);
      } else if (headByte === 215) {
        object = this.decodeExtension(8, 0);
      } else if (headByte === 216) {
        object = this.decodeExtension(16, 0);
      } else if (headByte === 199) {
        const size = this.lookU8();
        object = this.decodeExtension(size, 1);
      } else if (headByte === 200) {
        const size = this.lookU16();
        object = this.decodeExtension(size, 2);
      } else if (headByte === 201) {
        const size = this.lookU32();
        object = this.decodeExtension(size, 4);
      } else {
        throw new DecodeError(`Unrecognized type byte: ${prettyByte(headByte)}`);
      }
      this.complete();
      const stack = this.stack;
      while (stack.length > 0) {
        const state = stack.top();
        if (state.type === STATE_ARRAY) {
          state.array[state.position] = object;
          state.position++;
          if (state.position === state.size) {
            object = state.array;
            stack.release(state);
          } else {
            continue DECODE;
          }
        } else if (state.type === STATE_MAP_KEY) {
          if (object === "__proto__") {
            throw new DecodeError("The key __proto__ is not allowed");
          }
          state.key = this.mapKeyConverter(object);
          state.type = STATE_MAP_VALUE;
          continue DECODE;
        } else {
          state.map[state.key] = object;
          state.readCount++;
          if (state.readCount === state.size) {
            object = state.map;
            stack.release(state);
          } else {
            state.key = null;
            state.type = STATE_MAP_KEY;
            continue DECODE;
          }
        }
      }
      return object;
    }
  }
  readHeadByte() {
    if (this.headByte === HEAD_BYTE_REQUIRED) {
      this.headByte = this.readU8();
    }
    return this.headByte;
  }
  complete() {
    this.headByte = HEAD_BYTE_REQUIRED;
  }
  readArraySize() {
    const headByte = this.readHeadByte();
    switch (headByte) {
      case 220:
        return this.readU16();
      case 221:
        return this.readU32();
      default: {
        if (headByte < 160) {
          return headByte - 144;
        } else {
          throw new DecodeError(`Unrecognized array type byte: ${prettyByte(headByte)}`);
        }
      }
    }
  }
  pushMapState(size) {
    if (size > this.maxMapLength) {
      throw new DecodeError(`Max length exceeded: map length (${size}) > maxMapLengthLength (${this.maxMapLength})`);
    }
    this.stack.pushMapState(size);
  }
  pushArrayState(size) {
    if (size > this.maxArrayLength) {
      throw new DecodeError(`Max length exceeded: array length (${size}) > maxArrayLength (${this.maxArrayLength})`);
    }
    this.stack.pushArrayState(size);
  }
  decodeString(byteLength, headerOffset) {
    if (!this.rawStrings || this.stateIsMapKey()) {
      return this.decodeUtf8String(byteLength, headerOffset);
    }
    return this.decodeBinary(byteLength, headerOffset);
  }
  /**
   * @throws {@link RangeError}
   */
  decodeUtf8String(byteLength, headerOffset) {
    if (byteLength > this.maxStrLength) {
      throw new DecodeError(`Max length exceeded: UTF-8 byte length (${byteLength}) > maxStrLength (${this.maxStrLength})`);
    }
    if (this.bytes.byteLength < this.pos + headerOffset + byteLength) {
      throw MORE_DATA;
    }
    const offset = this.pos + headerOffset;
    let object;
    if (this.stateIsMapKey() && this.keyDecoder?.canBeCached(byteLength)) {
      object = this.keyDecoder.decode(this.bytes, offset, byteLength);
    } else {
      object = utf8Decode(this.bytes, offset, byteLength);
    }
    this.pos += headerOffset + byteLength;
    return object;
  }
  stateIsMapKey() {
    if (this.stack.length > 0) {
      const state = this.stack.top();
      return state.type === STATE_MAP_KEY;
    }
    return false;
  }
  /**
   * @throws {@link RangeError}
   */
  decodeBinary(byteLength, headOffset) {
    if (byteLength > this.maxBinLength) {
      throw new DecodeError(`Max length exceeded: bin length (${byteLength}) > maxBinLength (${this.maxBinLength})`);
    }
    if (!this.hasRemaining(byteLength + headOffset)) {
      throw MORE_DATA;
    }
    const offset = this.pos + headOffset;
    const object = this.bytes.subarray(offset, offset + byteLength);
    this.pos += headOffset + byteLength;
    return object;
  }
  decodeExtension(size, headOffset) {
    if (size > this.maxExtLength) {
      throw new DecodeError(`Max length exceeded: ext length (${size}) > maxExtLength (${this.maxExtLength})`);
    }
    const extType = this.view.getInt8(this.pos + headOffset);
    const data = this.decodeBinary(
      size,
      headOffset + 1
      /* extType */
    );
    return this.extensionCodec.decode(data, extType, this.context);
  }
  lookU8() {
    return this.view.getUint8(this.pos);
  }
  lookU16() {
    return this.view.getUint16(this.pos);
  }
  lookU32() {
    return this.view.getUint32(this.pos);
  }
  readU8() {
    const value = this.view.getUint8(this.pos);
    this.pos++;
    return value;
  }
  readI8() {
    const value = this.view.getInt8(this.pos);
    this.pos++;
    return value;
  }
  readU16() {
    const value = this.view.getUint16(this.pos);
    this.pos += 2;
    return value;
  }
  readI16() {
    const value = this.view.getInt16(this.pos);
    this.pos += 2;
    return value;
  }
  readU32() {
    const value = this.view.getUint32(this.pos);
    this.pos += 4;
    return value;
  }
  readI32() {
    const value = this.view.getInt32(this.pos);
    this.pos += 4;
    return value;
  }
  readU64() {
    const value = getUint64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readI64() {
    const value = getInt64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readU64AsBigInt() {
    const value = this.view.getBigUint64(this.pos);
    this.pos += 8;
    return value;
  }
  readI64AsBigInt() {
    const value = this.view.getBigInt64(this.pos);
    this.pos += 8;
    return value;
  }
  readF32() {
    const value = this.view.getFloat32(this.pos);
    this.pos += 4;
    return value;
  }
  readF64() {
    const value = this.view.getFloat64(this.pos);
    this.pos += 8;
    return value;
  }
};

// src/client.ts
var HubError = class extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
};
var ConnectionRejected = class extends HubError {
  closeCode;
  reason;
  constructor(closeCode, message, reason = "") {
    super(message);
    this.closeCode = closeCode;
    this.reason = reason;
  }
};
var CommandRejected = class extends HubError {
  code;
  index;
  retryAfter;
  thread;
  constructor(code, message, details = {}) {
    super(`${code}: ${message}`);
    this.code = code;
    if (details.index !== void 0) this.index = details.index;
    if (details.retryAfter !== void 0) this.retryAfter = details.retryAfter;
    if (details.thread !== void 0) this.thread = details.thread;
  }
};
var HubUnreachable = class extends HubError {
};
var OFFSET_RE = /^([0-9]{1,20})-([0-9]{1,20})$/;
var MAX_PART = (1n << 64n) - 1n;
var START_OFFSET = "0-0";
function offsetKey(offset) {
  const match = typeof offset === "string" ? OFFSET_RE.exec(offset) : null;
  if (match !== null) {
    const ms = BigInt(match[1]);
    const seq = BigInt(match[2]);
    if (ms <= MAX_PART && seq <= MAX_PART) return [ms, seq];
  }
  throw new HubError(`invalid offset ${JSON.stringify(offset)}: expected "<ms>-<seq>", e.g. "0-0"`);
}
function isOffset(value) {
  try {
    offsetKey(value);
    return true;
  } catch {
    return false;
  }
}
function compareKeys(a, b) {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1;
  return 0;
}
function isPosition(value) {
  if (typeof value !== "object" || value === null) return false;
  const { offset, epoch } = value;
  return isOffset(offset) && (epoch === null || epoch === void 0 || typeof epoch === "string");
}
function wellFormed(frame) {
  const { offset, epoch } = frame;
  return (offset === void 0 || isOffset(offset)) && (epoch === void 0 || epoch === null || typeof epoch === "string");
}
function isEventLike(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value) && typeof value.type === "string";
}
var SUBPROTOCOL_JSON = "agui-hub.v1.json";
var SUBPROTOCOL_MSGPACK = "agui-hub.v1.msgpack";
var BEARER_PREFIX = "agui-hub.bearer.";
var MAX_EVENTS_PER_PUBLISH = 1e3;
var MAX_THREAD_LENGTH = 256;
var DEFAULT_MAX_BUFFER = 1e4;
var MAX_RETRY_AFTER = 3e5;
var REFRESH_SHARE = 0.2;
var REFRESH_LEAD_MAX = 6e4;
var LONGEST_TIMER = 2 ** 31 - 1;
var NO_RESUME = /* @__PURE__ */ new Set([1e3, 4401, 4403]);
var CLIENT_FAULTS = /* @__PURE__ */ new Map([
  [1002, "protocol error"],
  [1007, "invalid data"],
  [1009, "message too big"]
]);
var TOKEN_CHARS = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;
var now = () => typeof performance !== "undefined" ? performance.now() : Date.now();
function describe(error) {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}
function report(what, error) {
  console.error(`agui-hub client: ${what}:`, error);
}
function backoffDelay(attempt, min, max) {
  return Math.random() * Math.min(max, min * 2 ** Math.min(attempt, 30));
}
function retryAfterMs(frame) {
  const value = frame.retryAfter;
  if (typeof value === "number" && Number.isFinite(value)) {
    return Math.min(Math.max(value * 1e3, 0), MAX_RETRY_AFTER);
  }
  return 0;
}
function jittered(wait) {
  return wait + Math.random() * (50 + 0.2 * wait);
}
function tokenExpiry(token) {
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const base64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const padded = base64 + "=".repeat((4 - base64.length % 4) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    if (typeof claims === "object" && claims !== null) {
      const exp = claims.exp;
      if (typeof exp === "number" && Number.isFinite(exp)) return exp * 1e3;
    }
  } catch {
  }
  return null;
}
function checkThread(thread) {
  if (typeof thread !== "string") throw new HubError("a thread name is a string");
  const length = [...thread].length;
  if (length < 1 || length > MAX_THREAD_LENGTH) {
    throw new HubError(`a thread name is a string of 1 to ${MAX_THREAD_LENGTH} characters`);
  }
  if (/[\u0000-\u001f\u007f]/.test(thread)) {
    throw new HubError(`thread name ${JSON.stringify(thread)} contains control characters`);
  }
  if (thread.trim() !== thread) {
    throw new HubError(
      `thread name ${JSON.stringify(thread)} begins or ends with whitespace: remove it`
    );
  }
  return thread;
}
function randomHex(bytes) {
  const data = new Uint8Array(bytes);
  const crypto = globalThis.crypto;
  if (crypto?.getRandomValues) crypto.getRandomValues(data);
  else for (let i = 0; i < bytes; i++) data[i] = Math.floor(Math.random() * 256);
  return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join("");
}
function startValue(start2) {
  return typeof start2 === "string" ? start2 : { offset: start2.offset, epoch: start2.epoch };
}
var Subscription = class {
  thread;
  #client;
  #start;
  #run;
  #maxBuffer;
  #handed;
  #recovered = null;
  #listeners = /* @__PURE__ */ new Set();
  #endListeners = /* @__PURE__ */ new Set();
  #buffer = [];
  #head = 0;
  #waiters = [];
  #iterating = false;
  // items are buffered for iterators
  #iteratorMade = false;
  #switchPending = false;
  #closed = false;
  #ended = false;
  #error = null;
  #errorThrown = false;
  // Receiving side, driven by the client: the position after the last item taken in,
  // the id of the subscribe whose reply is awaited (frames before it are stale), ...
  /** @internal */
  received;
  #receivedKeyOf = null;
  #receivedKey = [0n, 0n];
  /** @internal */
  awaiting = null;
  /** @internal */
  sentOn = null;
  /** @internal */
  lagged = false;
  /** @internal */
  retries = 0;
  /** @internal */
  retryTimer = null;
  #subscribedOnce = false;
  // Resubscribe from "snapshot": the gateway claimed a recovery it cannot have made
  // (another epoch), or sent a frame this subscription could not read; cleared by the
  // reply to that subscribe.
  #resync = false;
  // Frames this subscription could not read since its last good event or snapshot.
  #malformed = 0;
  /** @internal */
  constructor(client, thread, options) {
    const start2 = options.from ?? "live";
    if (!["live", "start", "snapshot"].includes(start2) && !isPosition(start2)) {
      throw new HubError('from is "live", "start", "snapshot" or {offset, epoch}');
    }
    const maxBuffer = options.maxBuffer ?? DEFAULT_MAX_BUFFER;
    if (!Number.isInteger(maxBuffer) || maxBuffer < 2) {
      throw new HubError("maxBuffer must be an integer of at least 2");
    }
    if (options.run !== void 0 && typeof options.run !== "string") {
      throw new HubError("run is a string");
    }
    this.#client = client;
    this.thread = thread;
    this.#start = typeof start2 === "string" ? start2 : { offset: start2.offset, epoch: start2.epoch ?? null };
    this.#run = options.run;
    this.#maxBuffer = maxBuffer;
    this.#handed = typeof this.#start === "string" ? null : this.#start;
    this.received = this.#handed;
    if (options.onItem !== void 0) this.#listeners.add(options.onItem);
    else this.#iterating = true;
  }
  /** The resume position after the last item handed out (the start until one is known). */
  get position() {
    if (this.#handed !== null) return { ...this.#handed };
    return this.#start;
  }
  /** The `recovered` flag of the latest `subscribed` item handed out. */
  get recovered() {
    return this.#recovered;
  }
  /** Why the subscription ended (null while it runs, or after a plain close). */
  get error() {
    return this.#error;
  }
  get closed() {
    return this.#closed || this.#ended;
  }
  /** Call *listener* synchronously with each item from now on; returns the unsubscribe.
   * A listener that throws is reported with console.error; the others still run. */
  onItem(listener) {
    this.#listeners.add(listener);
    if (this.#iterating && !this.#switchPending && !this.#iteratorMade) {
      this.#switchPending = true;
      queueMicrotask(() => {
        this.#switchPending = false;
        if (this.#iteratorMade || !this.#iterating) return;
        this.#iterating = false;
        while (this.#head < this.#buffer.length) this.#handOut(this.#take(), true);
        this.#resumeIfDrained();
      });
    }
    return () => this.#listeners.delete(listener);
  }
  /** Call *listener* once when the subscription ends: with the error, or null after close(). */
  onEnd(listener) {
    if (this.#ended || this.#closed) {
      const error = this.#error;
      queueMicrotask(() => this.#callEnd(listener, error));
      return () => void 0;
    }
    this.#endListeners.add(listener);
    return () => this.#endListeners.delete(listener);
  }
  [Symbol.asyncIterator]() {
    this.#iteratorMade = true;
    this.#iterating = true;
    return {
      next: () => this.#next(),
      return: async () => {
        await this.close();
        return { done: true, value: void 0 };
      }
    };
  }
  /** Unsubscribe; iterators end (what was buffered is discarded). */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#buffer = [];
    this.#head = 0;
    this.#client._remove(this);
    this.#finish(null);
  }
  // -- consumer side ----------------------------------------------------------------------------
  #next() {
    if (this.#head < this.#buffer.length) {
      const entry = this.#take();
      this.#resumeIfDrained();
      return Promise.resolve({ done: false, value: this.#handOut(entry, false) });
    }
    if (this.#error !== null && !this.#errorThrown && !this.#closed) {
      this.#errorThrown = true;
      return Promise.reject(this.#error);
    }
    if (this.#ended || this.#closed) return Promise.resolve({ done: true, value: void 0 });
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }
  #take() {
    const entry = this.#buffer[this.#head];
    this.#buffer[this.#head] = void 0;
    this.#head++;
    if (this.#head === this.#buffer.length) {
      this.#buffer = [];
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > this.#buffer.length) {
      this.#buffer = this.#buffer.slice(this.#head);
      this.#head = 0;
    }
    return entry;
  }
  get #buffered() {
    return this.#buffer.length - this.#head;
  }
  #handOut(entry, toListeners) {
    if (entry.position !== null) this.#handed = entry.position;
    if (entry.item.kind === "subscribed") this.#recovered = entry.item.recovered;
    if (toListeners) this.#callListeners(entry.item);
    return entry.item;
  }
  #callListeners(item) {
    for (const listener of [...this.#listeners]) {
      try {
        listener(item, this);
      } catch (error) {
        report(`an onItem listener of thread ${JSON.stringify(this.thread)} threw`, error);
      }
    }
  }
  #callEnd(listener, error) {
    try {
      listener(error);
    } catch (thrown) {
      report(`an onEnd listener of thread ${JSON.stringify(this.thread)} threw`, thrown);
    }
  }
  #resumeIfDrained() {
    if (this.lagged && this.#buffered <= Math.floor(this.#maxBuffer / 2)) {
      this.lagged = false;
      this.#client._resubscribe(this);
    }
  }
  #finish(error) {
    if (this.#ended) return;
    this.#ended = true;
    if (error !== null && this.#error === null) this.#error = error;
    if (this.retryTimer !== null) this.#client._clearTimer(this.retryTimer);
    this.retryTimer = null;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const waiter of waiters) {
      if (this.#error !== null && !this.#errorThrown && !this.#closed) {
        this.#errorThrown = true;
        waiter.reject(this.#error);
      } else {
        waiter.resolve({ done: true, value: void 0 });
      }
    }
    const listeners = [...this.#endListeners];
    this.#endListeners.clear();
    for (const listener of listeners) this.#callEnd(listener, this.#error);
  }
  // -- receiving side (called by the client) ----------------------------------------------------
  /** @internal The subscription ended: with *error*, or the client closed (null). */
  _end(error) {
    this.#finish(error);
  }
  #push(item, position) {
    if (position !== null) this.received = position;
    const entry = { item, position };
    if (!this.#iterating) {
      this.#handOut(entry, true);
      return;
    }
    const waiter = this.#waiters.shift();
    if (waiter !== void 0) {
      this.#callListeners(item);
      waiter.resolve({ done: false, value: this.#handOut(entry, false) });
      return;
    }
    this.#buffer.push(entry);
    this.#callListeners(item);
  }
  /** @internal The subscribe command to send now (from where it must resume). */
  _subscribeCommand(id) {
    this.awaiting = id;
    this.lagged = false;
    const received = this.received;
    let start2;
    if (this.#resync) start2 = "snapshot";
    else if (received === null) start2 = startValue(this.#start);
    else if (received.epoch === null && received.offset === START_OFFSET) start2 = "start";
    else start2 = { offset: received.offset, epoch: received.epoch };
    const command = { type: "subscribe", id, thread: this.thread, from: start2 };
    if (this.#run !== void 0) command.run = this.#run;
    return command;
  }
  /** @internal A frame of this thread could not be read (a malformed frame, or one the
   * decoder refused): what it carried is lost, so resubscribe from a snapshot rather than go
   * on silently short. A second one before a good event or snapshot ends the subscription
   * with a HubError: the gateway keeps sending what this client cannot read. */
  _malformed(what) {
    if (this.#ended || this.#closed) return;
    if (++this.#malformed > 1) {
      this.#client._remove(this);
      this.#finish(
        new HubError(
          `thread ${JSON.stringify(this.thread)}: the gateway sent ${what} again after a resync from a snapshot; the subscription stopped rather than go on with a gap`
        )
      );
      return;
    }
    console.warn(
      `agui-hub client: thread ${JSON.stringify(this.thread)}: ${what}; resubscribing from a snapshot`
    );
    this.#resync = true;
    this.awaiting = 0;
    this.#client._resubscribe(this);
  }
  /** A `recovered: true` across epochs (a gateway bug, a race): offsets of one epoch mean
   * nothing in another, so resubscribe from a snapshot instead of believing it. */
  #untrusted(epoch, recovered) {
    const received = this.received;
    if (!recovered || this.#resync || received === null || received.epoch === null) return false;
    if (epoch === received.epoch) return false;
    console.warn(
      `agui-hub client: thread ${JSON.stringify(this.thread)}: the gateway answered recovered=true in epoch ${String(epoch)} to a resume from epoch ${received.epoch}; not trusted: resubscribing from a snapshot`
    );
    this.#resync = true;
    this.awaiting = 0;
    this.#client._resubscribe(this);
    return true;
  }
  /** @internal */
  _onSubscribed(frame) {
    if (this.lagged) return;
    const id = frame.id ?? null;
    if (id !== null && id !== this.awaiting) return;
    if (id === null && this.awaiting !== null) return;
    if (!wellFormed(frame)) {
      this.awaiting = null;
      this._malformed("a malformed subscribed frame");
      return;
    }
    const epoch = typeof frame.epoch === "string" ? frame.epoch : null;
    const offset = typeof frame.offset === "string" ? frame.offset : START_OFFSET;
    let recovered = frame.recovered === true;
    const received = this.received;
    let resumed;
    let position;
    if (id !== null) {
      this.awaiting = null;
      this.retries = 0;
      if (this.#untrusted(epoch, recovered)) return;
      resumed = this.#subscribedOnce;
      this.#subscribedOnce = true;
      if (this.#resync) {
        this.#resync = false;
        recovered = false;
      }
      if (!recovered) position = null;
      else if (received !== null) position = { offset: received.offset, epoch };
      else if (this.#start === "live") position = { offset, epoch };
      else if (this.#start === "start") position = { offset: START_OFFSET, epoch };
      else position = null;
    } else if (this.#untrusted(epoch, recovered)) {
      return;
    } else {
      resumed = false;
      position = recovered ? { offset: received !== null ? received.offset : offset, epoch } : null;
    }
    this.#push(
      { kind: "subscribed", thread: this.thread, epoch, offset, recovered, resumed },
      position
    );
  }
  /** @internal */
  _onSnapshot(frame) {
    if (this.awaiting !== null || this.lagged) return;
    const events = frame.events;
    if (!wellFormed(frame) || !Array.isArray(events) || !events.every((event) => isEventLike(event))) {
      this._malformed("a malformed snapshot frame");
      return;
    }
    this.#malformed = 0;
    const offset = typeof frame.offset === "string" ? frame.offset : START_OFFSET;
    const epoch = typeof frame.epoch === "string" ? frame.epoch : null;
    const complete = frame.complete !== false;
    this.#push(
      {
        kind: "snapshot",
        thread: this.thread,
        offset,
        epoch,
        complete,
        events
      },
      { offset, epoch }
    );
  }
  /** @internal Returns false when the frame could not be taken (the buffer is full). */
  _onEvent(frame) {
    if (this.awaiting !== null || this.lagged) return true;
    const offset = frame.offset;
    const event = frame.event;
    let key = null;
    try {
      if (typeof offset === "string" && isEventLike(event)) key = offsetKey(offset);
    } catch {
    }
    if (key === null) {
      this._malformed("a malformed event frame");
      return true;
    }
    const received = this.received;
    if (received !== null) {
      if (received !== this.#receivedKeyOf) {
        this.#receivedKeyOf = received;
        this.#receivedKey = offsetKey(received.offset);
      }
      if (compareKeys(key, this.#receivedKey) <= 0) return true;
    }
    if (this.#iterating && this.#buffered >= this.#maxBuffer) {
      this.lagged = true;
      return false;
    }
    this.#malformed = 0;
    const position = { offset, epoch: received !== null ? received.epoch : null };
    this.#push(
      { kind: "event", thread: this.thread, offset, event },
      position
    );
    this.#receivedKeyOf = position;
    this.#receivedKey = key;
    return true;
  }
};
var HubClient = class {
  url;
  encoding;
  #subprotocol;
  #WebSocket;
  #token;
  #provider;
  #backoffMin;
  #backoffMax;
  #pingInterval;
  #pingTimeout;
  #openTimeout;
  #giveUpAfter;
  #maxFrameBytes;
  #maxPendingPublishes;
  #encoder = new Encoder({ ignoreUndefined: true });
  #decoder = new Decoder({ useBigInt64: false });
  #textEncoder = new TextEncoder();
  #status;
  #statusListeners = /* @__PURE__ */ new Set();
  #ws = null;
  #open = false;
  #everOpened = false;
  #openedAt = 0;
  #lostAt;
  #lastError = null;
  // the socket's error event, for a failed handshake
  #backoffAttempt = 0;
  // grows over connections until one proves healthy
  #faulted = false;
  // a CLIENT_FAULTS close since the gateway last answered
  #refused = false;
  // the provider's last token got a 401
  #kicked = false;
  // a command cut a reconnect pause short since the gateway last answered
  #pendingPublishes = 0;
  #failure = null;
  #closed = false;
  #closing = null;
  #timers = /* @__PURE__ */ new Set();
  #retryTimer = null;
  #openTimer = null;
  #watchdog = null;
  #lastFrameAt = 0;
  #pingSentAt = -1;
  #refreshTimer = null;
  #refreshAt = null;
  // ms since the epoch
  #expires = null;
  #nextId = 1;
  #eventPrefix = randomHex(8);
  #eventCounter = 0;
  #subs = /* @__PURE__ */ new Map();
  #inflight = /* @__PURE__ */ new Map();
  // sent, awaiting a reply, by id
  #waiting = /* @__PURE__ */ new Set();
  // requests (ping, auth) waiting for a connection
  #lanes = /* @__PURE__ */ new Map();
  #unsubscribes = /* @__PURE__ */ new Map();
  constructor(options) {
    if (typeof options !== "object" || options === null) {
      throw new HubError("new HubClient({url, ...}): the options object is missing");
    }
    let parsed;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new HubError(`not a WebSocket URL: ${JSON.stringify(options.url)}`);
    }
    if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") {
      throw new HubError(`not a WebSocket URL (ws:// or wss://): ${options.url}`);
    }
    this.url = options.url;
    const encoding = options.encoding ?? "msgpack";
    if (encoding !== "msgpack" && encoding !== "json") {
      throw new HubError('encoding is "msgpack" or "json"');
    }
    this.encoding = encoding;
    this.#subprotocol = encoding === "msgpack" ? SUBPROTOCOL_MSGPACK : SUBPROTOCOL_JSON;
    const constructor = options.WebSocket ?? globalThis.WebSocket ?? null;
    if (typeof constructor !== "function") {
      throw new HubError(
        "no WebSocket here: pass options.WebSocket (in Node 20: WebSocket from the ws package)"
      );
    }
    this.#WebSocket = constructor;
    const token = options.token;
    const badToken = typeof token !== "function" && (typeof token !== "string" || !token);
    if (token !== void 0 && badToken) {
      throw new HubError("token is a non-empty string or a function that returns one");
    }
    this.#token = typeof token === "string" ? token : null;
    this.#provider = typeof token === "function" ? token : null;
    const ms = (name, value, fallback) => {
      const chosen = value ?? fallback;
      if (typeof chosen !== "number" || !Number.isFinite(chosen) || chosen < 0) {
        throw new HubError(`${name} is a number of ms, at least 0`);
      }
      return chosen;
    };
    this.#backoffMin = ms("backoffMin", options.backoffMin, 500);
    this.#backoffMax = Math.max(this.#backoffMin, ms("backoffMax", options.backoffMax, 15e3));
    this.#pingInterval = Math.max(1, ms("pingInterval", options.pingInterval, 15e3));
    this.#pingTimeout = Math.max(1, ms("pingTimeout", options.pingTimeout, 1e4));
    this.#openTimeout = Math.max(1, ms("openTimeout", options.openTimeout, 1e4));
    this.#giveUpAfter = options.giveUpAfter === null || options.giveUpAfter === void 0 ? null : ms("giveUpAfter", options.giveUpAfter, 0);
    this.#maxFrameBytes = ms("maxFrameBytes", options.maxFrameBytes, 1024 * 1024);
    const pending = options.maxPendingPublishes ?? 1e3;
    if (!Number.isInteger(pending) || pending < 1) {
      throw new HubError("maxPendingPublishes is an integer of at least 1");
    }
    this.#maxPendingPublishes = pending;
    this.#status = Object.freeze({
      state: "connecting",
      reconnects: 0,
      attempt: 0,
      closeCode: null,
      closeReason: ""
    });
    this.#lostAt = now();
    void this.#connect();
  }
  // -- status -----------------------------------------------------------------------------------
  /** Where the connection is; a new object at every change. */
  get status() {
    return this.#status;
  }
  /** Call *listener* with the status at every transition; returns the unsubscribe. */
  onStatus(listener) {
    this.#statusListeners.add(listener);
    return () => this.#statusListeners.delete(listener);
  }
  #setStatus(patch) {
    const next = { ...this.#status, ...patch };
    if (!("error" in patch) && next.state === "open") delete next.error;
    if ("error" in patch && patch.error === void 0) delete next.error;
    this.#status = Object.freeze(next);
    for (const listener of [...this.#statusListeners]) {
      try {
        listener(this.#status);
      } catch (error) {
        report("a status listener threw", error);
      }
    }
  }
  // -- commands ---------------------------------------------------------------------------------
  /** Follow *thread*; the subscribe command goes out at once (or when connected). One
   * subscription per thread and client. */
  subscribe(thread, options = {}) {
    checkThread(thread);
    this.#usable();
    if (this.#subs.has(thread)) {
      throw new HubError(`already subscribed to thread ${JSON.stringify(thread)} on this client`);
    }
    const sub = new Subscription(this, thread, options);
    this.#subs.set(thread, sub);
    this._resubscribe(sub);
    return sub;
  }
  /** Publish *events* into *thread*; resolves with one offset per event.
   *
   * Calls about one thread are sent in call order without waiting for each other's
   * replies (pipelined); those unanswered when the connection drops are sent again after
   * the reconnect, with the same event ids and before any later one, so a drop never
   * reorders nor duplicates a thread's events. A refusal rejects with CommandRejected
   * (its `code`, and `index` for the event at fault). */
  publish(thread, events, options = {}) {
    try {
      checkThread(thread);
      this.#usable();
      if (!Array.isArray(events)) throw new HubError("events is an array of AG-UI events");
      if (events.length > MAX_EVENTS_PER_PUBLISH) {
        throw new HubError(`at most ${MAX_EVENTS_PER_PUBLISH} events per publish`);
      }
      events.forEach((event, index) => {
        if (typeof event !== "object" || event === null || typeof event.type !== "string") {
          throw new HubError(`events[${index}] is not an AG-UI event (an object with a type)`);
        }
      });
      let ids = options.eventIds;
      if (ids !== void 0) {
        if (!Array.isArray(ids) || ids.length !== events.length) {
          throw new HubError("eventIds must hold one id per event");
        }
        if (!ids.every((id) => typeof id === "string" && id.length > 0)) {
          throw new HubError("event ids are non-empty strings");
        }
        if (new Set(ids).size !== ids.length) {
          throw new HubError("eventIds must all be different (each event needs its own id)");
        }
        ids = [...ids];
      }
      if (events.length === 0) return Promise.resolve([]);
      if (this.#pendingPublishes >= this.#maxPendingPublishes) {
        const why = this.#open ? "" : " (the client is not connected)";
        throw new HubError(
          `${this.#pendingPublishes} publishes are waiting for their reply${why}, the maxPendingPublishes limit: wait for some to settle before publishing more`
        );
      }
      ids ??= this.newEventIds(events.length);
      const timeout = options.timeout === void 0 ? this.#giveUpAfter : options.timeout;
      return this.#enqueuePublish(thread, [...events], ids, timeout);
    } catch (error) {
      return Promise.reject(error);
    }
  }
  /** Round trip of a protocol ping, in ms (waits for a connection up to *timeout*). */
  async ping(options = {}) {
    const began = now();
    await this.#request({ type: "ping" }, options.timeout ?? this.#openTimeout);
    return now() - began;
  }
  /** Fresh event ids, unique to this client: "<random prefix>-<counter>". */
  newEventIds(count) {
    const ids = [];
    for (let i = 0; i < count; i++) ids.push(`${this.#eventPrefix}-${++this.#eventCounter}`);
    return ids;
  }
  /** Close the connection; iterators end after what they buffered, commands in flight
   * reject, every timer is cleared. */
  close() {
    if (this.#closing !== null) return this.#closing;
    this.#closed = true;
    this.#clearAllTimers();
    const ws = this.#ws;
    this.#ws = null;
    this.#open = false;
    const closed = new HubError("the client was closed");
    this.#rejectAll(closed);
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    for (const sub of subs) sub._end(null);
    this.#setStatus({ state: "closed", attempt: 0 });
    this.#closing = ws === null ? Promise.resolve() : this.#shut(ws);
    return this.#closing;
  }
  // -- internals: requests ----------------------------------------------------------------------
  #usable() {
    if (this.#failure !== null) throw this.#failure;
    if (this.#closed) throw new HubError("the client is closed");
  }
  #id() {
    return this.#nextId++;
  }
  #send(ws, frame) {
    const data = this.encoding === "msgpack" ? this.#encoder.encode(frame) : JSON.stringify(frame);
    const size = typeof data !== "string" ? data.length : data.length * 3 <= this.#maxFrameBytes ? 0 : this.#textEncoder.encode(data).length;
    if (size > this.#maxFrameBytes) return size;
    try {
      ws.send(data);
    } catch (error) {
      console.warn(`agui-hub client: send failed: ${describe(error)}`);
    }
    return 0;
  }
  /** Send *out* on the open connection with a fresh id; 0, or the frame's size when it is
   * over maxFrameBytes (nothing sent). */
  #sendOutgoing(out) {
    const ws = this.#ws;
    if (out.sentOn !== null) this.#inflight.delete(out.id);
    out.id = this.#id();
    const size = this.#send(ws, { ...out.command, id: out.id });
    if (size > 0) return size;
    out.sentOn = ws;
    this.#inflight.set(out.id, out);
    return 0;
  }
  #request(command, timeout) {
    this.#usable();
    return new Promise((resolve, reject) => {
      const deadline = now() + timeout;
      let done = false;
      const finish = () => {
        if (done) return false;
        done = true;
        this.#clearTimer(timer);
        this.#waiting.delete(out);
        if (this.#inflight.get(out.id) === out) this.#inflight.delete(out.id);
        return true;
      };
      const out = {
        command,
        id: 0,
        sentOn: null,
        kind: "request",
        reply: (frame) => {
          if (finish()) resolve(frame);
        },
        error: (frame) => {
          const error = this.#commandError(frame);
          const wait = jittered(retryAfterMs(frame));
          if (error.code === "rate_limited" && now() + wait < deadline) {
            out.sentOn = null;
            this.#timer(() => {
              if (!done) this.#sendOrWait(out);
            }, wait);
            return;
          }
          if (finish()) reject(error);
        },
        fail: (error) => {
          if (finish()) reject(error);
        }
      };
      const timer = this.#timer(() => {
        out.fail(new HubUnreachable(`no reply from ${this.url} in ${timeout} ms`));
      }, timeout);
      this.#sendOrWait(out);
    });
  }
  #sendOrWait(out) {
    if (this.#closed || this.#failure !== null) return;
    if (this.#open) {
      this.#waiting.delete(out);
      this.#sendOutgoing(out);
    } else {
      this.#waiting.add(out);
      this.#kick();
    }
  }
  #commandError(frame) {
    const code = typeof frame.code === "string" ? frame.code : "error";
    const message = typeof frame.message === "string" ? frame.message : "";
    const details = {};
    if (typeof frame.index === "number" && Number.isInteger(frame.index)) {
      details.index = frame.index;
    }
    if (code === "rate_limited") details.retryAfter = retryAfterMs(frame) / 1e3;
    if (typeof frame.thread === "string") details.thread = frame.thread;
    return new CommandRejected(code, message, details);
  }
  // -- internals: publishing --------------------------------------------------------------------
  #enqueuePublish(thread, events, ids, timeout) {
    return new Promise((resolve, reject) => {
      const command = { type: "publish", thread, events, eventIds: ids };
      let lane = this.#lanes.get(thread);
      if (lane === void 0) {
        lane = [];
        this.#lanes.set(thread, lane);
      }
      const theLane = lane;
      const finish = () => {
        if (entry.done) return;
        entry.done = true;
        this.#pendingPublishes--;
        if (entry.timer !== null) this.#clearTimer(entry.timer);
        entry.timer = null;
        this.#inflight.delete(entry.id);
        const index = theLane.indexOf(entry);
        if (index >= 0) theLane.splice(index, 1);
        if (theLane.length === 0 && this.#lanes.get(thread) === theLane) this.#lanes.delete(thread);
        else this.#pump(theLane);
      };
      const entry = {
        command,
        id: 0,
        sentOn: null,
        kind: "publish",
        thread,
        held: false,
        done: false,
        attempts: 0,
        deadline: timeout === null ? null : now() + timeout,
        timer: null,
        resolve: (offsets) => {
          if (entry.done) return;
          finish();
          resolve(offsets);
        },
        fail: (error) => {
          if (entry.done) return;
          finish();
          reject(error);
        },
        reply: (frame) => {
          const offsets = frame.offsets;
          if (!Array.isArray(offsets) || offsets.length !== events.length) {
            const what = JSON.stringify(frame);
            entry.fail(new HubError(`the gateway answered a publish with ${what}`));
          } else {
            entry.resolve(offsets);
          }
        },
        error: (frame) => this.#publishRefused(entry, theLane, frame)
      };
      if (entry.deadline !== null) {
        entry.timer = this.#timer(() => {
          entry.timer = null;
          entry.fail(
            new HubUnreachable(
              `publish to ${this.url} gave up after ${timeout} ms without a reply`
            )
          );
        }, timeout);
      }
      lane.push(entry);
      this.#pendingPublishes++;
      if (this.#open) this.#pump(lane);
      else this.#kick();
    });
  }
  /** Send the lane's entries that are not sent on this connection, in order, stopping at
   * one that is paused: the gateway then receives a thread's publishes in call order. */
  #pump(lane) {
    if (!this.#open) return;
    const ws = this.#ws;
    for (const entry of [...lane]) {
      if (entry.done || entry.sentOn === ws) continue;
      if (entry.held) return;
      const size = this.#sendOutgoing(entry);
      if (size > 0) {
        entry.fail(
          new CommandRejected(
            "payload_too_large",
            `the publish frame is ${size} bytes, over maxFrameBytes (${this.#maxFrameBytes})`,
            { thread: entry.thread }
          )
        );
      }
    }
  }
  #publishRefused(entry, lane, frame) {
    const error = this.#commandError(frame);
    if (error.code !== "rate_limited" && error.code !== "store_unavailable") {
      entry.fail(error);
      return;
    }
    const delay = error.code === "rate_limited" ? jittered(retryAfterMs(frame)) : backoffDelay(entry.attempts++, this.#backoffMin, this.#backoffMax);
    if (entry.deadline !== null && now() + delay > entry.deadline) {
      entry.fail(error);
      return;
    }
    this.#inflight.delete(entry.id);
    entry.sentOn = null;
    entry.held = true;
    this.#timer(() => {
      entry.held = false;
      this.#pump(lane);
    }, delay);
  }
  // -- internals: subscriptions -----------------------------------------------------------------
  /** @internal Subscribe *sub* again from what it took in (on the open connection). */
  _resubscribe(sub) {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = null;
    if (!this.#open || this.#subs.get(sub.thread) !== sub || sub.lagged) return;
    const ws = this.#ws;
    sub.sentOn = ws;
    this.#send(ws, sub._subscribeCommand(this.#id()));
  }
  /** @internal */
  _remove(sub) {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = null;
    if (this.#subs.get(sub.thread) !== sub) return;
    this.#subs.delete(sub.thread);
    if (this.#open && sub.sentOn === this.#ws) this.#unsubscribe(sub.thread);
  }
  #unsubscribe(thread) {
    const id = this.#id();
    this.#unsubscribes.set(id, thread);
    this.#send(this.#ws, { type: "unsubscribe", id, thread });
  }
  // -- internals: timers ------------------------------------------------------------------------
  #timer(callback, delay) {
    const timer = setTimeout(
      () => {
        this.#timers.delete(timer);
        try {
          callback();
        } catch (error) {
          report("internal error", error);
        }
      },
      Math.min(Math.max(delay, 0), LONGEST_TIMER)
    );
    this.#timers.add(timer);
    return timer;
  }
  /** @internal */
  _clearTimer(timer) {
    this.#clearTimer(timer);
  }
  #clearTimer(timer) {
    clearTimeout(timer);
    this.#timers.delete(timer);
  }
  #clearAllTimers() {
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    this.#retryTimer = this.#openTimer = this.#watchdog = this.#refreshTimer = null;
    for (const sub of this.#subs.values()) sub.retryTimer = null;
  }
  // -- internals: the connection ----------------------------------------------------------------
  async #connect() {
    this.#retryTimer = null;
    if (this.#closed || this.#failure !== null) return;
    this.#setStatus({
      state: this.#everOpened ? "reconnecting" : "connecting",
      attempt: this.#status.attempt + 1
    });
    let token;
    try {
      token = await this.#tokenNow();
    } catch (error) {
      if (this.#closed || this.#failure !== null) return;
      console.warn(`agui-hub client: the token provider failed: ${describe(error)}`);
      this.#setStatus({ error: error instanceof Error ? error : new HubError(describe(error)) });
      this.#scheduleAttempt();
      return;
    }
    if (this.#closed || this.#failure !== null) return;
    const protocols = [this.#subprotocol];
    if (token !== null) {
      if (!TOKEN_CHARS.test(token)) {
        this.#fail(
          new ConnectionRejected(
            4401,
            "the token has characters a WebSocket subprotocol cannot carry"
          )
        );
        return;
      }
      protocols.push(BEARER_PREFIX + token);
    }
    let ws;
    try {
      ws = new this.#WebSocket(this.url, protocols);
    } catch (error) {
      this.#fail(new HubUnreachable(`cannot open a WebSocket to ${this.url}: ${describe(error)}`));
      return;
    }
    this.#ws = ws;
    this.#lastError = null;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => this.#onOpen(ws, token);
    ws.onmessage = (event) => this.#onMessage(ws, event.data);
    ws.onerror = (event) => {
      if (ws !== this.#ws) return;
      const { message, error } = event ?? {};
      if (typeof message === "string" && message) this.#lastError = message;
      else this.#lastError = error instanceof Error ? error.message : null;
    };
    ws.onclose = (event) => this.#lost(ws, event.code, event.reason ?? "");
    this.#openTimer = this.#timer(() => {
      this.#openTimer = null;
      if (ws === this.#ws && !this.#open) {
        this.#lastError = `no WebSocket handshake in ${this.#openTimeout} ms`;
        this.#drop(ws, 1006, this.#lastError);
      }
    }, this.#openTimeout);
  }
  async #tokenNow() {
    if (this.#provider === null) return this.#token;
    const token = await this.#provider();
    if (typeof token !== "string" || !token) {
      throw new HubError(`the token provider returned ${typeof token}, not a non-empty string`);
    }
    return token;
  }
  #onOpen(ws, token) {
    if (ws !== this.#ws || this.#closed) return;
    if (this.#openTimer !== null) this.#clearTimer(this.#openTimer);
    this.#openTimer = null;
    if (ws.protocol !== this.#subprotocol) {
      this.#lastError = `${this.url} did not accept the ${this.#subprotocol} subprotocol`;
      this.#drop(ws, 1006, this.#lastError);
      return;
    }
    const reconnect = this.#everOpened;
    this.#open = true;
    this.#everOpened = true;
    this.#openedAt = now();
    this.#refused = false;
    this.#lastFrameAt = now();
    this.#pingSentAt = -1;
    this.#adopt(token, null);
    this.#setStatus({
      state: "open",
      attempt: 0,
      reconnects: this.#status.reconnects + (reconnect ? 1 : 0),
      error: void 0
    });
    if (ws !== this.#ws || !this.#open) return;
    for (const sub of [...this.#subs.values()]) {
      if (sub.sentOn !== ws) this._resubscribe(sub);
    }
    for (const lane of [...this.#lanes.values()]) this.#pump(lane);
    for (const out of [...this.#waiting]) this.#sendOrWait(out);
    this.#scheduleWatchdog(this.#pingInterval);
  }
  #onMessage(ws, data) {
    if (ws !== this.#ws || !this.#open) return;
    this.#lastFrameAt = now();
    let frame;
    try {
      if (this.encoding === "msgpack") {
        if (typeof data === "string") {
          console.warn("agui-hub client: a text frame on a msgpack connection ignored");
          return;
        }
        const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : null;
        if (bytes === null) {
          console.warn("agui-hub client: a frame of an unknown kind ignored");
          return;
        }
        frame = this.#decoder.decode(bytes);
      } else {
        if (typeof data !== "string") {
          console.warn("agui-hub client: a binary frame on a JSON connection ignored");
          return;
        }
        frame = JSON.parse(data);
      }
    } catch (error) {
      const why = `an undecodable frame (${describe(error)})`;
      this.#drop(ws, 1006, why);
      for (const sub of [...this.#subs.values()]) sub._malformed(why);
      return;
    }
    if (typeof frame !== "object" || frame === null || Array.isArray(frame)) return;
    try {
      this.#dispatch(frame);
    } catch (error) {
      report(`internal error handling a ${JSON.stringify(frame.type)} frame`, error);
    }
  }
  #dispatch(frame) {
    const kind = frame.type;
    const thread = frame.thread;
    const sub = typeof thread === "string" ? this.#subs.get(thread) : void 0;
    const id = typeof frame.id === "number" ? frame.id : null;
    switch (kind) {
      case "event":
        if (sub !== void 0 && !sub._onEvent(frame)) {
          if (sub.sentOn === this.#ws) this.#unsubscribe(sub.thread);
          sub.sentOn = null;
        }
        return;
      case "snapshot":
        sub?._onSnapshot(frame);
        return;
      case "subscribed":
        if (sub !== void 0) {
          if (id !== null && id === sub.awaiting) this.#healthy();
          sub._onSubscribed(frame);
        }
        return;
      case "error":
        this.#onError(frame, sub, id);
        return;
      case "unsubscribed":
        if (id !== null) this.#unsubscribes.delete(id);
        return;
      default: {
        const out = id === null ? void 0 : this.#inflight.get(id);
        if (out !== void 0) {
          this.#inflight.delete(id);
          this.#healthy();
          out.reply(frame);
        }
      }
    }
  }
  #onError(frame, sub, id) {
    const code = String(frame.code);
    const message = String(frame.message ?? "");
    const out = id === null ? void 0 : this.#inflight.get(id);
    if (out !== void 0) {
      this.#inflight.delete(id);
      out.error(frame);
      return;
    }
    if (sub !== void 0 && id !== null && id === sub.awaiting) {
      if (code === "store_unavailable") {
        const low = this.#backoffMin;
        const cap = Math.max(
          low,
          Math.min(this.#backoffMax, Math.max(low, 1e3) * 2 ** Math.min(sub.retries, 30))
        );
        sub.retries++;
        this.#retrySubscribe(sub, low + Math.random() * (cap - low));
        return;
      }
      if (code === "rate_limited") {
        this.#retrySubscribe(sub, jittered(retryAfterMs(frame)));
        return;
      }
      this.#subs.delete(sub.thread);
      sub._end(this.#commandError(frame));
      return;
    }
    if (id !== null && this.#unsubscribes.has(id)) {
      const thread = this.#unsubscribes.get(id);
      this.#unsubscribes.delete(id);
      if (code === "rate_limited") {
        this.#timer(() => {
          const current = this.#subs.get(thread);
          if (this.#open && (current === void 0 || current.sentOn !== this.#ws)) {
            this.#unsubscribe(thread);
          }
        }, jittered(retryAfterMs(frame)));
      }
      return;
    }
    if (id === null && code === "forbidden" && sub !== void 0) {
      this.#subs.delete(sub.thread);
      sub._end(this.#commandError(frame));
      return;
    }
    console.warn(`agui-hub client: error from the gateway: ${code} ${message}`);
  }
  #retrySubscribe(sub, delay) {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = this.#timer(() => {
      sub.retryTimer = null;
      this._resubscribe(sub);
    }, delay);
  }
  /** The connection works: the next reconnect starts from the shortest pause. */
  #healthy() {
    this.#backoffAttempt = 0;
    this.#faulted = false;
    this.#kicked = false;
  }
  // -- internals: liveness ----------------------------------------------------------------------
  #scheduleWatchdog(delay) {
    if (this.#watchdog !== null) this.#clearTimer(this.#watchdog);
    this.#watchdog = this.#timer(() => {
      this.#watchdog = null;
      this.#watch();
    }, delay);
  }
  /** Browsers cannot see WebSocket pings: an app-level ping after pingInterval ms without a
   * frame, and no frame pingTimeout ms after it means the connection is dead. */
  #watch() {
    const ws = this.#ws;
    if (ws === null || !this.#open) return;
    const at = now();
    const idle = at - this.#lastFrameAt;
    const pinged = this.#pingSentAt >= this.#lastFrameAt;
    if (pinged && at - this.#pingSentAt >= this.#pingTimeout) {
      this.#drop(ws, 1006, `no frame from the gateway for ${Math.round(idle)} ms`);
      return;
    }
    if (pinged) {
      this.#scheduleWatchdog(this.#pingSentAt + this.#pingTimeout - at);
      return;
    }
    if (idle >= this.#pingInterval) {
      const id = this.#id();
      const noop = () => void 0;
      const probe = {
        command: {},
        id,
        sentOn: ws,
        kind: "probe",
        reply: noop,
        error: noop,
        fail: noop
      };
      this.#inflight.set(id, probe);
      this.#send(ws, { type: "ping", id });
      this.#pingSentAt = at;
      this.#scheduleWatchdog(this.#pingTimeout);
      return;
    }
    this.#scheduleWatchdog(this.#pingInterval - idle);
  }
  /** Give up on *ws* now (dead, or a handshake that failed), without waiting for its close. */
  #drop(ws, code, reason) {
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.onerror = () => void 0;
    try {
      ws.close();
    } catch {
    }
    ws.terminate?.();
    this.#lost(ws, code, reason);
  }
  #lost(ws, code, reason) {
    if (ws !== this.#ws) return;
    const wasOpen = this.#open;
    this.#ws = null;
    this.#open = false;
    for (const timer of [this.#openTimer, this.#watchdog, this.#refreshTimer]) {
      if (timer !== null) this.#clearTimer(timer);
    }
    this.#openTimer = this.#watchdog = this.#refreshTimer = null;
    if (this.#closed || this.#failure !== null) return;
    if (!wasOpen) {
      this.#attemptFailed();
      return;
    }
    this.#lostAt = now();
    if (this.#lostAt - this.#openedAt >= this.#backoffMax) {
      this.#healthy();
    }
    const fault = CLIENT_FAULTS.get(code);
    const sent = [...this.#inflight.values()];
    this.#inflight.clear();
    this.#unsubscribes.clear();
    for (const sub of this.#subs.values()) sub.sentOn = null;
    for (const out of sent) {
      out.sentOn = null;
      if (fault !== void 0) {
        const why = reason ? `: ${reason}` : "";
        out.error({
          type: "error",
          code: code === 1009 ? "payload_too_large" : "bad_frame",
          message: `the gateway closed the connection (${code} ${fault}${why}): it could not take a frame of this client`
        });
      } else if (out.kind === "request") {
        this.#waiting.add(out);
      }
    }
    const closed = { closeCode: code, closeReason: reason };
    if (NO_RESUME.has(code) && !(code === 4401 && this.#provider !== null)) {
      this.#fail(this.#rejected(code, reason), closed);
      return;
    }
    if (fault !== void 0) {
      if (this.#faulted) {
        this.#fail(
          new ConnectionRejected(
            code,
            `the gateway closed the connection with ${code} (${fault}) twice without answering anything in between: it refuses this client's frames; fix the client (e.g. maxFrameBytes) rather than reconnect`,
            reason
          ),
          closed
        );
        return;
      }
      this.#faulted = true;
    }
    this.#setStatus({ ...closed, state: "reconnecting", attempt: 0, error: void 0 });
    this.#scheduleAttempt();
  }
  #rejected(code, reason) {
    const why = reason ? ` (${reason})` : "";
    let message = `the gateway closed the connection with ${code}${why}`;
    if (code === 4401) {
      message += ": its credentials expired (or never came); pass token a function that returns fresh tokens, so that the client renews them and reconnects by itself";
    } else if (code === 4403) {
      message += ": its credentials were revoked; do not reconnect with them";
    } else {
      message += ": it asked the client to stop";
    }
    return new ConnectionRejected(code, message, reason);
  }
  /** A connection attempt failed before the WebSocket opened. */
  #attemptFailed() {
    const why = this.#lastError ?? "the WebSocket closed before it opened";
    const status = /Unexpected server response: (\d{3})/.exec(why)?.[1];
    if (status === "401") {
      if (this.#provider === null || this.#refused) {
        this.#fail(
          new ConnectionRejected(
            4401,
            this.#token === null && this.#provider === null ? `the gateway requires a token (HTTP 401); pass the token option` : "the gateway refused the token (HTTP 401); get a new token",
            why
          )
        );
        return;
      }
      this.#refused = true;
    } else if (status === "403") {
      this.#fail(
        new ConnectionRejected(
          4403,
          "the gateway refused the connection (HTTP 403): the credentials were revoked or this Origin is not allowed; do not retry with them",
          why
        )
      );
      return;
    }
    this.#setStatus({ error: new HubUnreachable(`cannot connect to ${this.url}: ${why}`) });
    this.#scheduleAttempt();
  }
  #scheduleAttempt() {
    if (this.#closed || this.#failure !== null) return;
    let delay = backoffDelay(this.#backoffAttempt++, this.#backoffMin, this.#backoffMax);
    if (this.#giveUpAfter !== null) {
      const left = this.#lostAt + this.#giveUpAfter - now();
      if (left <= 0) {
        const last = this.#status.error ? `: ${this.#status.error.message}` : "";
        this.#fail(
          new HubUnreachable(
            `no connection to ${this.url} for ${this.#giveUpAfter} ms; gave up${last}`
          )
        );
        return;
      }
      delay = Math.min(delay, left);
    }
    this.#retryTimer = this.#timer(() => void this.#connect(), delay);
  }
  /** A command waits for the connection: cut the reconnect pause short (backoff spares a
   * gateway nobody needs right now, not one that is wanted), once per outage: commands
   * issued in a loop must not turn the backoff into a handshake storm. */
  #kick() {
    if (this.#retryTimer === null || this.#kicked || this.#refused) return;
    this.#kicked = true;
    this.#clearTimer(this.#retryTimer);
    this.#retryTimer = null;
    void this.#connect();
  }
  // -- internals: credentials -------------------------------------------------------------------
  /** The connection's credentials are now *token* (valid until *expires*, else its exp):
   * with a provider, renew them with an `auth` command before they expire. */
  #adopt(token, expires) {
    this.#expires = expires ?? (token === null ? null : tokenExpiry(token));
    if (this.#refreshTimer !== null) this.#clearTimer(this.#refreshTimer);
    this.#refreshTimer = null;
    if (this.#expires === null || this.#provider === null) {
      this.#refreshAt = null;
      return;
    }
    const left = Math.max(0, this.#expires - Date.now());
    this.#refreshAt = this.#expires - Math.min(left * REFRESH_SHARE, REFRESH_LEAD_MAX);
    this.#scheduleRefresh();
  }
  #scheduleRefresh() {
    if (this.#refreshAt === null || !this.#open) return;
    const due = this.#refreshAt;
    this.#refreshTimer = this.#timer(() => {
      this.#refreshTimer = null;
      if (Date.now() < due) this.#scheduleRefresh();
      else void this.#refresh();
    }, due - Date.now());
  }
  async #refresh() {
    const expires = this.#expires;
    const ws = this.#ws;
    try {
      const token = await this.#tokenNow();
      const reply = await this.#request({ type: "auth", token }, this.#openTimeout);
      if (reply.type !== "authenticated") throw new HubError(`auth answered ${String(reply.type)}`);
      if (this.#ws !== ws) return;
      const until = typeof reply.expires === "number" ? reply.expires * 1e3 : null;
      this.#adopt(token, until);
    } catch (error) {
      if (this.#closed || this.#failure !== null || this.#ws !== ws) return;
      console.warn(
        `agui-hub client: renewing the credentials failed (${describe(error)}); trying again shortly`
      );
      const left = expires === null ? 0 : expires - Date.now();
      const pause = left > 0 ? Math.min(1e4, Math.max(250, left / 4)) : 2e3;
      this.#refreshAt = Date.now() + pause;
      this.#scheduleRefresh();
    }
  }
  // -- internals: the end -----------------------------------------------------------------------
  /** Stop for good: everything waiting fails with *error*. */
  #fail(error, patch = {}) {
    if (this.#failure !== null || this.#closed) return;
    this.#failure = error;
    this.#clearAllTimers();
    const ws = this.#ws;
    this.#ws = null;
    this.#open = false;
    this.#rejectAll(error);
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    for (const sub of subs) sub._end(error);
    this.#setStatus({ ...patch, state: "closed", error });
    if (ws !== null) void this.#shut(ws);
  }
  #rejectAll(error) {
    const lanes = [...this.#lanes.values()];
    this.#lanes.clear();
    const outs = [...lanes.flat(), ...this.#inflight.values(), ...this.#waiting];
    this.#inflight.clear();
    this.#waiting.clear();
    for (const out of outs) out.fail(error);
  }
  /** Close *ws* and wait (at most a second) for its close, so a Node process can exit. */
  #shut(ws) {
    return new Promise((resolve) => {
      ws.onopen = ws.onmessage = null;
      ws.onerror = () => void 0;
      const timer = setTimeout(() => {
        ws.terminate?.();
        resolve();
      }, 1e3);
      ws.onclose = () => {
        clearTimeout(timer);
        resolve();
      };
      try {
        ws.close(1e3);
      } catch {
        clearTimeout(timer);
        resolve();
      }
    });
  }
};

// node_modules/fast-json-patch/module/core.mjs
var core_exports = {};
__export(core_exports, {
  JsonPatchError: () => JsonPatchError,
  _areEquals: () => _areEquals,
  applyOperation: () => applyOperation,
  applyPatch: () => applyPatch,
  applyReducer: () => applyReducer,
  deepClone: () => deepClone,
  getValueByPointer: () => getValueByPointer,
  validate: () => validate,
  validator: () => validator
});

// node_modules/fast-json-patch/module/helpers.mjs
/*!
 * https://github.com/Starcounter-Jack/JSON-Patch
 * (c) 2017-2022 Joachim Wester
 * MIT licensed
 */
var __extends = /* @__PURE__ */ (function() {
  var extendStatics = function(d, b) {
    extendStatics = Object.setPrototypeOf || { __proto__: [] } instanceof Array && function(d2, b2) {
      d2.__proto__ = b2;
    } || function(d2, b2) {
      for (var p in b2) if (b2.hasOwnProperty(p)) d2[p] = b2[p];
    };
    return extendStatics(d, b);
  };
  return function(d, b) {
    extendStatics(d, b);
    function __() {
      this.constructor = d;
    }
    d.prototype = b === null ? Object.create(b) : (__.prototype = b.prototype, new __());
  };
})();
var _hasOwnProperty = Object.prototype.hasOwnProperty;
function hasOwnProperty(obj, key) {
  return _hasOwnProperty.call(obj, key);
}
function _objectKeys(obj) {
  if (Array.isArray(obj)) {
    var keys_1 = new Array(obj.length);
    for (var k = 0; k < keys_1.length; k++) {
      keys_1[k] = "" + k;
    }
    return keys_1;
  }
  if (Object.keys) {
    return Object.keys(obj);
  }
  var keys = [];
  for (var i in obj) {
    if (hasOwnProperty(obj, i)) {
      keys.push(i);
    }
  }
  return keys;
}
function _deepClone(obj) {
  switch (typeof obj) {
    case "object":
      return JSON.parse(JSON.stringify(obj));
    //Faster than ES5 clone - http://jsperf.com/deep-cloning-of-objects/5
    case "undefined":
      return null;
    //this is how JSON.stringify behaves for array items
    default:
      return obj;
  }
}
function isInteger(str2) {
  var i = 0;
  var len = str2.length;
  var charCode;
  while (i < len) {
    charCode = str2.charCodeAt(i);
    if (charCode >= 48 && charCode <= 57) {
      i++;
      continue;
    }
    return false;
  }
  return true;
}
function escapePathComponent(path) {
  if (path.indexOf("/") === -1 && path.indexOf("~") === -1)
    return path;
  return path.replace(/~/g, "~0").replace(/\//g, "~1");
}
function unescapePathComponent(path) {
  return path.replace(/~1/g, "/").replace(/~0/g, "~");
}
function hasUndefined(obj) {
  if (obj === void 0) {
    return true;
  }
  if (obj) {
    if (Array.isArray(obj)) {
      for (var i_1 = 0, len = obj.length; i_1 < len; i_1++) {
        if (hasUndefined(obj[i_1])) {
          return true;
        }
      }
    } else if (typeof obj === "object") {
      var objKeys = _objectKeys(obj);
      var objKeysLength = objKeys.length;
      for (var i = 0; i < objKeysLength; i++) {
        if (hasUndefined(obj[objKeys[i]])) {
          return true;
        }
      }
    }
  }
  return false;
}
function patchErrorMessageFormatter(message, args) {
  var messageParts = [message];
  for (var key in args) {
    var value = typeof args[key] === "object" ? JSON.stringify(args[key], null, 2) : args[key];
    if (typeof value !== "undefined") {
      messageParts.push(key + ": " + value);
    }
  }
  return messageParts.join("\n");
}
var PatchError = (
  /** @class */
  (function(_super) {
    __extends(PatchError2, _super);
    function PatchError2(message, name, index, operation, tree) {
      var _newTarget = this.constructor;
      var _this = _super.call(this, patchErrorMessageFormatter(message, { name, index, operation, tree })) || this;
      _this.name = name;
      _this.index = index;
      _this.operation = operation;
      _this.tree = tree;
      Object.setPrototypeOf(_this, _newTarget.prototype);
      _this.message = patchErrorMessageFormatter(message, { name, index, operation, tree });
      return _this;
    }
    return PatchError2;
  })(Error)
);

// node_modules/fast-json-patch/module/core.mjs
var JsonPatchError = PatchError;
var deepClone = _deepClone;
var objOps = {
  add: function(obj, key, document2) {
    obj[key] = this.value;
    return { newDocument: document2 };
  },
  remove: function(obj, key, document2) {
    var removed = obj[key];
    delete obj[key];
    return { newDocument: document2, removed };
  },
  replace: function(obj, key, document2) {
    var removed = obj[key];
    obj[key] = this.value;
    return { newDocument: document2, removed };
  },
  move: function(obj, key, document2) {
    var removed = getValueByPointer(document2, this.path);
    if (removed) {
      removed = _deepClone(removed);
    }
    var originalValue = applyOperation(document2, { op: "remove", path: this.from }).removed;
    applyOperation(document2, { op: "add", path: this.path, value: originalValue });
    return { newDocument: document2, removed };
  },
  copy: function(obj, key, document2) {
    var valueToCopy = getValueByPointer(document2, this.from);
    applyOperation(document2, { op: "add", path: this.path, value: _deepClone(valueToCopy) });
    return { newDocument: document2 };
  },
  test: function(obj, key, document2) {
    return { newDocument: document2, test: _areEquals(obj[key], this.value) };
  },
  _get: function(obj, key, document2) {
    this.value = obj[key];
    return { newDocument: document2 };
  }
};
var arrOps = {
  add: function(arr, i, document2) {
    if (isInteger(i)) {
      arr.splice(i, 0, this.value);
    } else {
      arr[i] = this.value;
    }
    return { newDocument: document2, index: i };
  },
  remove: function(arr, i, document2) {
    var removedList = arr.splice(i, 1);
    return { newDocument: document2, removed: removedList[0] };
  },
  replace: function(arr, i, document2) {
    var removed = arr[i];
    arr[i] = this.value;
    return { newDocument: document2, removed };
  },
  move: objOps.move,
  copy: objOps.copy,
  test: objOps.test,
  _get: objOps._get
};
function getValueByPointer(document2, pointer) {
  if (pointer == "") {
    return document2;
  }
  var getOriginalDestination = { op: "_get", path: pointer };
  applyOperation(document2, getOriginalDestination);
  return getOriginalDestination.value;
}
function applyOperation(document2, operation, validateOperation, mutateDocument, banPrototypeModifications, index) {
  if (validateOperation === void 0) {
    validateOperation = false;
  }
  if (mutateDocument === void 0) {
    mutateDocument = true;
  }
  if (banPrototypeModifications === void 0) {
    banPrototypeModifications = true;
  }
  if (index === void 0) {
    index = 0;
  }
  if (validateOperation) {
    if (typeof validateOperation == "function") {
      validateOperation(operation, 0, document2, operation.path);
    } else {
      validator(operation, 0);
    }
  }
  if (operation.path === "") {
    var returnValue = { newDocument: document2 };
    if (operation.op === "add") {
      returnValue.newDocument = operation.value;
      return returnValue;
    } else if (operation.op === "replace") {
      returnValue.newDocument = operation.value;
      returnValue.removed = document2;
      return returnValue;
    } else if (operation.op === "move" || operation.op === "copy") {
      returnValue.newDocument = getValueByPointer(document2, operation.from);
      if (operation.op === "move") {
        returnValue.removed = document2;
      }
      return returnValue;
    } else if (operation.op === "test") {
      returnValue.test = _areEquals(document2, operation.value);
      if (returnValue.test === false) {
        throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
      }
      returnValue.newDocument = document2;
      return returnValue;
    } else if (operation.op === "remove") {
      returnValue.removed = document2;
      returnValue.newDocument = null;
      return returnValue;
    } else if (operation.op === "_get") {
      operation.value = document2;
      return returnValue;
    } else {
      if (validateOperation) {
        throw new JsonPatchError("Operation `op` property is not one of operations defined in RFC-6902", "OPERATION_OP_INVALID", index, operation, document2);
      } else {
        return returnValue;
      }
    }
  } else {
    if (!mutateDocument) {
      document2 = _deepClone(document2);
    }
    var path = operation.path || "";
    var keys = path.split("/");
    var obj = document2;
    var t = 1;
    var len = keys.length;
    var existingPathFragment = void 0;
    var key = void 0;
    var validateFunction = void 0;
    if (typeof validateOperation == "function") {
      validateFunction = validateOperation;
    } else {
      validateFunction = validator;
    }
    while (true) {
      key = keys[t];
      if (key && key.indexOf("~") != -1) {
        key = unescapePathComponent(key);
      }
      if (banPrototypeModifications && (key == "__proto__" || key == "prototype" && t > 0 && keys[t - 1] == "constructor")) {
        throw new TypeError("JSON-Patch: modifying `__proto__` or `constructor/prototype` prop is banned for security reasons, if this was on purpose, please set `banPrototypeModifications` flag false and pass it to this function. More info in fast-json-patch README");
      }
      if (validateOperation) {
        if (existingPathFragment === void 0) {
          if (obj[key] === void 0) {
            existingPathFragment = keys.slice(0, t).join("/");
          } else if (t == len - 1) {
            existingPathFragment = operation.path;
          }
          if (existingPathFragment !== void 0) {
            validateFunction(operation, 0, document2, existingPathFragment);
          }
        }
      }
      t++;
      if (Array.isArray(obj)) {
        if (key === "-") {
          key = obj.length;
        } else {
          if (validateOperation && !isInteger(key)) {
            throw new JsonPatchError("Expected an unsigned base-10 integer value, making the new referenced value the array element with the zero-based index", "OPERATION_PATH_ILLEGAL_ARRAY_INDEX", index, operation, document2);
          } else if (isInteger(key)) {
            key = ~~key;
          }
        }
        if (t >= len) {
          if (validateOperation && operation.op === "add" && key > obj.length) {
            throw new JsonPatchError("The specified index MUST NOT be greater than the number of elements in the array", "OPERATION_VALUE_OUT_OF_BOUNDS", index, operation, document2);
          }
          var returnValue = arrOps[operation.op].call(operation, obj, key, document2);
          if (returnValue.test === false) {
            throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
          }
          return returnValue;
        }
      } else {
        if (t >= len) {
          var returnValue = objOps[operation.op].call(operation, obj, key, document2);
          if (returnValue.test === false) {
            throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
          }
          return returnValue;
        }
      }
      obj = obj[key];
      if (validateOperation && t < len && (!obj || typeof obj !== "object")) {
        throw new JsonPatchError("Cannot perform operation at the desired path", "OPERATION_PATH_UNRESOLVABLE", index, operation, document2);
      }
    }
  }
}
function applyPatch(document2, patch, validateOperation, mutateDocument, banPrototypeModifications) {
  if (mutateDocument === void 0) {
    mutateDocument = true;
  }
  if (banPrototypeModifications === void 0) {
    banPrototypeModifications = true;
  }
  if (validateOperation) {
    if (!Array.isArray(patch)) {
      throw new JsonPatchError("Patch sequence must be an array", "SEQUENCE_NOT_AN_ARRAY");
    }
  }
  if (!mutateDocument) {
    document2 = _deepClone(document2);
  }
  var results = new Array(patch.length);
  for (var i = 0, length_1 = patch.length; i < length_1; i++) {
    results[i] = applyOperation(document2, patch[i], validateOperation, true, banPrototypeModifications, i);
    document2 = results[i].newDocument;
  }
  results.newDocument = document2;
  return results;
}
function applyReducer(document2, operation, index) {
  var operationResult = applyOperation(document2, operation);
  if (operationResult.test === false) {
    throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
  }
  return operationResult.newDocument;
}
function validator(operation, index, document2, existingPathFragment) {
  if (typeof operation !== "object" || operation === null || Array.isArray(operation)) {
    throw new JsonPatchError("Operation is not an object", "OPERATION_NOT_AN_OBJECT", index, operation, document2);
  } else if (!objOps[operation.op]) {
    throw new JsonPatchError("Operation `op` property is not one of operations defined in RFC-6902", "OPERATION_OP_INVALID", index, operation, document2);
  } else if (typeof operation.path !== "string") {
    throw new JsonPatchError("Operation `path` property is not a string", "OPERATION_PATH_INVALID", index, operation, document2);
  } else if (operation.path.indexOf("/") !== 0 && operation.path.length > 0) {
    throw new JsonPatchError('Operation `path` property must start with "/"', "OPERATION_PATH_INVALID", index, operation, document2);
  } else if ((operation.op === "move" || operation.op === "copy") && typeof operation.from !== "string") {
    throw new JsonPatchError("Operation `from` property is not present (applicable in `move` and `copy` operations)", "OPERATION_FROM_REQUIRED", index, operation, document2);
  } else if ((operation.op === "add" || operation.op === "replace" || operation.op === "test") && operation.value === void 0) {
    throw new JsonPatchError("Operation `value` property is not present (applicable in `add`, `replace` and `test` operations)", "OPERATION_VALUE_REQUIRED", index, operation, document2);
  } else if ((operation.op === "add" || operation.op === "replace" || operation.op === "test") && hasUndefined(operation.value)) {
    throw new JsonPatchError("Operation `value` property is not present (applicable in `add`, `replace` and `test` operations)", "OPERATION_VALUE_CANNOT_CONTAIN_UNDEFINED", index, operation, document2);
  } else if (document2) {
    if (operation.op == "add") {
      var pathLen = operation.path.split("/").length;
      var existingPathLen = existingPathFragment.split("/").length;
      if (pathLen !== existingPathLen + 1 && pathLen !== existingPathLen) {
        throw new JsonPatchError("Cannot perform an `add` operation at the desired path", "OPERATION_PATH_CANNOT_ADD", index, operation, document2);
      }
    } else if (operation.op === "replace" || operation.op === "remove" || operation.op === "_get") {
      if (operation.path !== existingPathFragment) {
        throw new JsonPatchError("Cannot perform the operation at a path that does not exist", "OPERATION_PATH_UNRESOLVABLE", index, operation, document2);
      }
    } else if (operation.op === "move" || operation.op === "copy") {
      var existingValue = { op: "_get", path: operation.from, value: void 0 };
      var error = validate([existingValue], document2);
      if (error && error.name === "OPERATION_PATH_UNRESOLVABLE") {
        throw new JsonPatchError("Cannot perform the operation from a path that does not exist", "OPERATION_FROM_UNRESOLVABLE", index, operation, document2);
      }
    }
  }
}
function validate(sequence, document2, externalValidator) {
  try {
    if (!Array.isArray(sequence)) {
      throw new JsonPatchError("Patch sequence must be an array", "SEQUENCE_NOT_AN_ARRAY");
    }
    if (document2) {
      applyPatch(_deepClone(document2), _deepClone(sequence), externalValidator || true);
    } else {
      externalValidator = externalValidator || validator;
      for (var i = 0; i < sequence.length; i++) {
        externalValidator(sequence[i], i, document2, void 0);
      }
    }
  } catch (e) {
    if (e instanceof JsonPatchError) {
      return e;
    } else {
      throw e;
    }
  }
}
function _areEquals(a, b) {
  if (a === b)
    return true;
  if (a && b && typeof a == "object" && typeof b == "object") {
    var arrA = Array.isArray(a), arrB = Array.isArray(b), i, length, key;
    if (arrA && arrB) {
      length = a.length;
      if (length != b.length)
        return false;
      for (i = length; i-- !== 0; )
        if (!_areEquals(a[i], b[i]))
          return false;
      return true;
    }
    if (arrA != arrB)
      return false;
    var keys = Object.keys(a);
    length = keys.length;
    if (length !== Object.keys(b).length)
      return false;
    for (i = length; i-- !== 0; )
      if (!b.hasOwnProperty(keys[i]))
        return false;
    for (i = length; i-- !== 0; ) {
      key = keys[i];
      if (!_areEquals(a[key], b[key]))
        return false;
    }
    return true;
  }
  return a !== a && b !== b;
}

// node_modules/fast-json-patch/module/duplex.mjs
var duplex_exports = {};
__export(duplex_exports, {
  compare: () => compare,
  generate: () => generate,
  observe: () => observe,
  unobserve: () => unobserve
});
/*!
 * https://github.com/Starcounter-Jack/JSON-Patch
 * (c) 2017-2021 Joachim Wester
 * MIT license
 */
var beforeDict = /* @__PURE__ */ new WeakMap();
var Mirror = (
  /** @class */
  /* @__PURE__ */ (function() {
    function Mirror2(obj) {
      this.observers = /* @__PURE__ */ new Map();
      this.obj = obj;
    }
    return Mirror2;
  })()
);
var ObserverInfo = (
  /** @class */
  /* @__PURE__ */ (function() {
    function ObserverInfo2(callback, observer) {
      this.callback = callback;
      this.observer = observer;
    }
    return ObserverInfo2;
  })()
);
function getMirror(obj) {
  return beforeDict.get(obj);
}
function getObserverFromMirror(mirror, callback) {
  return mirror.observers.get(callback);
}
function removeObserverFromMirror(mirror, observer) {
  mirror.observers.delete(observer.callback);
}
function unobserve(root, observer) {
  observer.unobserve();
}
function observe(obj, callback) {
  var patches = [];
  var observer;
  var mirror = getMirror(obj);
  if (!mirror) {
    mirror = new Mirror(obj);
    beforeDict.set(obj, mirror);
  } else {
    var observerInfo = getObserverFromMirror(mirror, callback);
    observer = observerInfo && observerInfo.observer;
  }
  if (observer) {
    return observer;
  }
  observer = {};
  mirror.value = _deepClone(obj);
  if (callback) {
    observer.callback = callback;
    observer.next = null;
    var dirtyCheck = function() {
      generate(observer);
    };
    var fastCheck = function() {
      clearTimeout(observer.next);
      observer.next = setTimeout(dirtyCheck);
    };
    if (typeof window !== "undefined") {
      window.addEventListener("mouseup", fastCheck);
      window.addEventListener("keyup", fastCheck);
      window.addEventListener("mousedown", fastCheck);
      window.addEventListener("keydown", fastCheck);
      window.addEventListener("change", fastCheck);
    }
  }
  observer.patches = patches;
  observer.object = obj;
  observer.unobserve = function() {
    generate(observer);
    clearTimeout(observer.next);
    removeObserverFromMirror(mirror, observer);
    if (typeof window !== "undefined") {
      window.removeEventListener("mouseup", fastCheck);
      window.removeEventListener("keyup", fastCheck);
      window.removeEventListener("mousedown", fastCheck);
      window.removeEventListener("keydown", fastCheck);
      window.removeEventListener("change", fastCheck);
    }
  };
  mirror.observers.set(callback, new ObserverInfo(callback, observer));
  return observer;
}
function generate(observer, invertible) {
  if (invertible === void 0) {
    invertible = false;
  }
  var mirror = beforeDict.get(observer.object);
  _generate(mirror.value, observer.object, observer.patches, "", invertible);
  if (observer.patches.length) {
    applyPatch(mirror.value, observer.patches);
  }
  var temp = observer.patches;
  if (temp.length > 0) {
    observer.patches = [];
    if (observer.callback) {
      observer.callback(temp);
    }
  }
  return temp;
}
function _generate(mirror, obj, patches, path, invertible) {
  if (obj === mirror) {
    return;
  }
  if (typeof obj.toJSON === "function") {
    obj = obj.toJSON();
  }
  var newKeys = _objectKeys(obj);
  var oldKeys = _objectKeys(mirror);
  var changed = false;
  var deleted = false;
  for (var t = oldKeys.length - 1; t >= 0; t--) {
    var key = oldKeys[t];
    var oldVal = mirror[key];
    if (hasOwnProperty(obj, key) && !(obj[key] === void 0 && oldVal !== void 0 && Array.isArray(obj) === false)) {
      var newVal = obj[key];
      if (typeof oldVal == "object" && oldVal != null && typeof newVal == "object" && newVal != null && Array.isArray(oldVal) === Array.isArray(newVal)) {
        _generate(oldVal, newVal, patches, path + "/" + escapePathComponent(key), invertible);
      } else {
        if (oldVal !== newVal) {
          changed = true;
          if (invertible) {
            patches.push({ op: "test", path: path + "/" + escapePathComponent(key), value: _deepClone(oldVal) });
          }
          patches.push({ op: "replace", path: path + "/" + escapePathComponent(key), value: _deepClone(newVal) });
        }
      }
    } else if (Array.isArray(mirror) === Array.isArray(obj)) {
      if (invertible) {
        patches.push({ op: "test", path: path + "/" + escapePathComponent(key), value: _deepClone(oldVal) });
      }
      patches.push({ op: "remove", path: path + "/" + escapePathComponent(key) });
      deleted = true;
    } else {
      if (invertible) {
        patches.push({ op: "test", path, value: mirror });
      }
      patches.push({ op: "replace", path, value: obj });
      changed = true;
    }
  }
  if (!deleted && newKeys.length == oldKeys.length) {
    return;
  }
  for (var t = 0; t < newKeys.length; t++) {
    var key = newKeys[t];
    if (!hasOwnProperty(mirror, key) && obj[key] !== void 0) {
      patches.push({ op: "add", path: path + "/" + escapePathComponent(key), value: _deepClone(obj[key]) });
    }
  }
}
function compare(tree1, tree2, invertible) {
  if (invertible === void 0) {
    invertible = false;
  }
  var patches = [];
  _generate(tree1, tree2, patches, "", invertible);
  return patches;
}

// node_modules/fast-json-patch/index.mjs
var fast_json_patch_default = Object.assign({}, core_exports, duplex_exports, {
  JsonPatchError: PatchError,
  deepClone: _deepClone,
  escapePathComponent,
  unescapePathComponent
});

// src/transcript.ts
var CLIENT_METADATA_KEY = "@ag-ui/client";
var UNDECLARED = /* @__PURE__ */ Symbol("undeclared");
var MAX_PROBLEMS = 50;
function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
function pyTruthy(value) {
  if (value === null || value === void 0 || value === false || value === 0 || value === "") {
    return false;
  }
  if (Array.isArray(value)) return value.length > 0;
  if (isObject(value)) return Object.keys(value).length > 0;
  return true;
}
function own(table, key) {
  return typeof key === "string" && Object.hasOwn(table, key) ? table[key] : void 0;
}
function isKey(value) {
  return value === null || ["string", "number", "boolean"].includes(typeof value);
}
function pick(event, ...keys) {
  const out = {};
  for (const key of keys) if (key in event) out[key] = event[key];
  return out;
}
function mergeMetadata(target, event) {
  if (!target || !("metadata" in event)) return;
  const existing = target.metadata;
  const incoming = event.metadata;
  target.metadata = isObject(existing) && Object.keys(existing).length > 0 ? { ...existing, ...incoming } : { ...incoming };
}
function ownMessage(message) {
  if (!isObject(message)) throw new TypeError("a message is not an object");
  const owned = { ...message };
  const calls = owned.toolCalls;
  if (calls !== void 0 && calls !== null) {
    if (!Array.isArray(calls)) throw new TypeError("toolCalls is not a list");
    owned.toolCalls = calls.map((c) => {
      const call = isObject(c) ? c : {};
      return { ...call, function: { ...isObject(call.function) ? call.function : {} } };
    });
  }
  return owned;
}
function clone(value) {
  return value === void 0 ? value : structuredClone(value);
}
var Malformed = class extends Error {
};
function need(event, key, check, what) {
  if (!(key in event)) throw new Malformed(`missing field ${key}`);
  const value = event[key];
  if (!check(value)) throw new Malformed(`${key} is not ${what}`);
  return value;
}
var str = (e, key) => need(e, key, (v) => typeof v === "string", "a string");
var anyKey = (e, key) => need(e, key, isKey, "a string");
var BASE_FIELDS = ["type", "timestamp", "rawEvent"];
var KINDS = {
  TEXT_MESSAGE_CHUNK: {
    name: "text",
    chunk: "TEXT_MESSAGE_CHUNK",
    idField: "messageId",
    start: "TEXT_MESSAGE_START",
    content: "TEXT_MESSAGE_CONTENT",
    end: "TEXT_MESSAGE_END",
    declared: /* @__PURE__ */ new Set([...BASE_FIELDS, "messageId", "role", "delta", "name", "subagentRunId", "metadata"])
  },
  TOOL_CALL_CHUNK: {
    name: "tool",
    chunk: "TOOL_CALL_CHUNK",
    idField: "toolCallId",
    start: "TOOL_CALL_START",
    content: "TOOL_CALL_ARGS",
    end: "TOOL_CALL_END",
    declared: /* @__PURE__ */ new Set([
      ...BASE_FIELDS,
      "toolCallId",
      "toolCallName",
      "parentMessageId",
      "delta",
      "subagentRunId",
      "metadata"
    ])
  },
  REASONING_MESSAGE_CHUNK: {
    name: "reasoning",
    chunk: "REASONING_MESSAGE_CHUNK",
    idField: "messageId",
    start: "REASONING_MESSAGE_START",
    content: "REASONING_MESSAGE_CONTENT",
    end: "REASONING_MESSAGE_END",
    declared: /* @__PURE__ */ new Set([...BASE_FIELDS, "messageId", "delta", "subagentRunId", "metadata"])
  }
};
var CLOSE_OWN_LANE = /* @__PURE__ */ new Set([
  "TEXT_MESSAGE_START",
  "TEXT_MESSAGE_CONTENT",
  "TEXT_MESSAGE_END",
  "TOOL_CALL_START",
  "TOOL_CALL_ARGS",
  "TOOL_CALL_END",
  "TOOL_CALL_RESULT",
  "STATE_SNAPSHOT",
  "STATE_DELTA",
  "CUSTOM",
  "STEP_STARTED",
  "STEP_FINISHED",
  "REASONING_START",
  "REASONING_MESSAGE_START",
  "REASONING_MESSAGE_CONTENT",
  "REASONING_MESSAGE_END",
  "REASONING_END"
]);
var CLOSE_ALL_LANES = /* @__PURE__ */ new Set(["RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"]);
var CLOSE_SUBAGENT_LANE = /* @__PURE__ */ new Set(["SUBAGENT_FINISHED", "SUBAGENT_ERROR"]);
var ChunkExpander = class {
  lanes = /* @__PURE__ */ new Map();
  expand(event) {
    const type = event.type;
    const kind = own(KINDS, type);
    if (kind) return this.expandChunk(kind, event);
    if (this.lanes.size === 0) return [event];
    let ends;
    if (CLOSE_ALL_LANES.has(type)) {
      ends = this.flush();
    } else if (CLOSE_OWN_LANE.has(type) || CLOSE_SUBAGENT_LANE.has(type)) {
      const lane = event.subagentRunId ?? null;
      if (lane === null && CLOSE_SUBAGENT_LANE.has(type)) return [event];
      ends = this.close(lane);
    } else {
      return [event];
    }
    ends.push(event);
    return ends;
  }
  flush() {
    const ends = [...this.lanes.values()].map(endEvent);
    this.lanes.clear();
    return ends;
  }
  close(lane) {
    const stream = this.lanes.get(lane);
    if (!stream) return [];
    this.lanes.delete(lane);
    return [endEvent(stream)];
  }
  resolveLane(kind, id, tag) {
    if (id !== null) {
      for (const [lane, stream] of this.lanes) {
        if (stream.kind === kind && stream.id === id) {
          if (tag !== null && tag !== lane) throw new Malformed(`chunk for ${id} in another lane`);
          return lane;
        }
      }
      return tag;
    }
    if (tag !== null) return tag;
    const parent = this.lanes.get(null);
    if (parent && parent.kind === kind) return null;
    const candidates = [...this.lanes].filter(([, s]) => s.kind === kind).map(([lane]) => lane);
    if (candidates.length > 1) throw new Malformed("a chunk without id could continue several streams");
    return candidates.length ? candidates[0] : null;
  }
  expandChunk(kind, chunk) {
    const id = chunk[kind.idField] ?? null;
    const lane = this.resolveLane(kind, id, chunk.subagentRunId ?? null);
    const current = this.lanes.get(lane);
    const out = [];
    let stream;
    if (current && current.kind === kind && (id === null || id === current.id)) {
      for (const [field, value] of current.established) {
        const repeated = chunk[field] ?? null;
        if (repeated !== null && repeated !== value) {
          throw new Malformed(`a continuation chunk changes ${field}`);
        }
      }
      stream = current;
    } else {
      if (id === null) throw new Malformed(`the first ${kind.chunk} has no ${kind.idField}`);
      if (kind.name === "tool" && (chunk.toolCallName ?? null) === null) {
        throw new Malformed("the first TOOL_CALL_CHUNK has no toolCallName");
      }
      if (current) {
        this.lanes.delete(lane);
        out.push(endEvent(current));
      }
      const start2 = { type: kind.start, [kind.idField]: id };
      let established = [];
      if (kind.name === "text") {
        const role = chunk.role ?? "assistant";
        const name = chunk.name ?? null;
        start2.role = role;
        if (name !== null) start2.name = name;
        established = [
          ["role", role],
          ["name", name]
        ];
      } else if (kind.name === "tool") {
        const parent = chunk.parentMessageId ?? null;
        start2.toolCallName = chunk.toolCallName;
        if (parent !== null) start2.parentMessageId = parent;
        established = [
          ["toolCallName", chunk.toolCallName],
          ["parentMessageId", parent]
        ];
      } else {
        start2.role = "reasoning";
      }
      carry(start2, chunk, lane);
      stream = { kind, id, lane, established };
      this.lanes.set(lane, stream);
      out.push(start2);
    }
    const extra = {};
    for (const [key, value] of Object.entries(chunk)) if (!kind.declared.has(key)) extra[key] = value;
    const delta = chunk.delta ?? null;
    const rawEvent = chunk.rawEvent ?? null;
    const hasExtra = Object.keys(extra).length > 0;
    if (delta !== null || rawEvent !== null || !out.length && ((chunk.metadata ?? null) !== null || hasExtra)) {
      const content = { ...extra, type: kind.content, [kind.idField]: stream.id, delta: delta ?? "" };
      carry(content, chunk, stream.lane);
      if (rawEvent !== null) content.rawEvent = rawEvent;
      out.push(content);
    } else if (hasExtra && out.length) {
      out[out.length - 1] = { ...extra, ...out[out.length - 1] };
    }
    return out;
  }
};
function carry(event, chunk, lane) {
  if (lane !== null) event.subagentRunId = lane;
  if ((chunk.timestamp ?? null) !== null) event.timestamp = chunk.timestamp;
  if ((chunk.metadata ?? null) !== null) event.metadata = chunk.metadata;
}
function endEvent(stream) {
  const end = { type: stream.kind.end, [stream.kind.idField]: stream.id };
  if (stream.lane !== null) end.subagentRunId = stream.lane;
  return end;
}
function freshChanges(reset) {
  return {
    reset,
    order: reset,
    messages: /* @__PURE__ */ new Set(),
    runs: reset,
    changedRuns: /* @__PURE__ */ new Set(),
    state: reset,
    open: reset
  };
}
var Transcript = class {
  messages = [];
  state = {};
  /** Why the shown state may be wrong (a STATE_DELTA that did not apply), else null. */
  stateProblem = null;
  runs = [];
  /** Streams still open, by id: text and reasoning messages, tool calls. */
  openMessages = /* @__PURE__ */ new Set();
  openToolCalls = /* @__PURE__ */ new Set();
  openReasoning = /* @__PURE__ */ new Set();
  openReasoningSpans = /* @__PURE__ */ new Set();
  activeSubagents = /* @__PURE__ */ new Map();
  /** Events that could not be folded (the latest few). */
  problems = [];
  problemCount = 0;
  /** Events folded since the last reset. */
  eventCount = 0;
  chunks = new ChunkExpander();
  byId = /* @__PURE__ */ new Map();
  calls = /* @__PURE__ */ new Map();
  assistantCalls = /* @__PURE__ */ new Map();
  /** Tool results by the tool call they answer (the first one), for the view. */
  results = /* @__PURE__ */ new Map();
  /** The run a message was first seen in (for the view's grouping). */
  runOf = /* @__PURE__ */ new WeakMap();
  changes = freshChanges(true);
  /** Start over (before a snapshot's events: they replace everything). */
  reset() {
    this.messages = [];
    this.state = {};
    this.stateProblem = null;
    this.runs = [];
    this.openMessages.clear();
    this.openToolCalls.clear();
    this.openReasoning.clear();
    this.openReasoningSpans.clear();
    this.activeSubagents.clear();
    this.problems = [];
    this.problemCount = 0;
    this.eventCount = 0;
    this.chunks = new ChunkExpander();
    this.reindex();
    this.changes = freshChanges(true);
  }
  /** What changed since the last call. */
  takeChanges() {
    const changes = this.changes;
    this.changes = freshChanges(false);
    return changes;
  }
  applyAll(events) {
    for (const event of events) this.apply(event);
  }
  /** Fold one event; never throws. Returns false when the event was not folded. */
  apply(event) {
    this.eventCount += 1;
    const type = isObject(event) && typeof event.type === "string" ? event.type : "event";
    try {
      if (!isObject(event)) throw new Malformed("an event is not an object");
      if ("metadata" in event && !isObject(event.metadata)) throw new Malformed("metadata is not an object");
      if (own(KINDS, type) && "delta" in event && typeof event.delta !== "string" && event.delta !== null) {
        throw new Malformed("delta is not a string");
      }
      for (const expanded of this.chunks.expand(event)) {
        const handler = own(HANDLERS, expanded.type);
        if (handler) handler(this, expanded);
      }
      return true;
    } catch (error) {
      this.problem(type, error instanceof Error ? error.message : String(error));
      return false;
    }
  }
  problem(type, reason) {
    this.problemCount += 1;
    this.problems.push({ type, reason });
    if (this.problems.length > MAX_PROBLEMS) this.problems.shift();
  }
  // -- queries for the view ------------------------------------------------------------------
  message(id) {
    return this.byId.get(id);
  }
  /** The tool message answering a tool call. */
  resultOf(toolCallId) {
    return this.results.get(toolCallId);
  }
  /** Whether a tool message is shown with its call (so not on its own). */
  isAttachedResult(message) {
    if (message.role !== "tool" || message.toolCallId === void 0) return false;
    return this.results.get(message.toolCallId) === message && this.calls.has(message.toolCallId);
  }
  /** The owner message of a tool call. */
  callOwner(toolCallId) {
    return this.calls.get(toolCallId)?.[0];
  }
  runFor(message) {
    return this.runOf.get(message) ?? null;
  }
  get currentRun() {
    return this.runs.length ? this.runs[this.runs.length - 1] : null;
  }
  /** A plain copy: what window.aguiViewer.model() hands out. */
  snapshot() {
    return {
      messages: clone(this.messages),
      state: clone(this.state),
      runs: clone(this.runs),
      stateProblem: this.stateProblem
    };
  }
  // -- internals ------------------------------------------------------------------------------
  touch(message) {
    if (message) this.changes.messages.add(message);
  }
  add(message) {
    this.messages.push(message);
    this.index(message);
    this.runOf.set(message, this.currentRun);
    this.changes.order = true;
    this.touch(message);
  }
  insert(at, message) {
    this.messages.splice(at, 0, message);
    this.runOf.set(message, this.currentRun);
    this.changes.order = true;
    this.touch(message);
  }
  /** A message that came in a snapshot: it belongs to the run current now, unless known. */
  adopt(message) {
    if (!this.runOf.has(message)) this.runOf.set(message, this.currentRun);
    this.touch(message);
  }
  index(message) {
    const id = message.id;
    if (isKey(id) && !this.byId.has(id)) this.byId.set(id, message);
    if (message.role === "tool" && isKey(message.toolCallId) && !this.results.has(message.toolCallId)) {
      this.results.set(message.toolCallId, message);
    }
    const calls = message.toolCalls;
    if (!Array.isArray(calls)) return;
    for (const call of calls) {
      if (!isObject(call) || !isKey(call.id)) continue;
      if (!this.calls.has(call.id)) this.calls.set(call.id, [message, call]);
      if (message.role === "assistant" && !this.assistantCalls.has(call.id)) {
        this.assistantCalls.set(call.id, [message, call]);
      }
    }
  }
  reindex() {
    this.byId = /* @__PURE__ */ new Map();
    this.calls = /* @__PURE__ */ new Map();
    this.assistantCalls = /* @__PURE__ */ new Map();
    this.results = /* @__PURE__ */ new Map();
    for (const message of this.messages) this.index(message);
    this.changes.order = true;
  }
  indexCall(owner, call) {
    if (!this.calls.has(call.id)) this.calls.set(call.id, [owner, call]);
    if (!this.assistantCalls.has(call.id)) this.assistantCalls.set(call.id, [owner, call]);
  }
  indexResult(message) {
    const first = this.byId.get(message.id);
    if (first === void 0) this.byId.set(message.id, message);
    else if (first !== message && this.messages.indexOf(first) > this.messages.indexOf(message)) {
      this.byId.set(message.id, message);
    }
    const key = message.toolCallId;
    if (isKey(key)) {
      const known = this.results.get(key);
      if (known === void 0 || this.messages.indexOf(known) > this.messages.indexOf(message)) {
        this.results.set(key, message);
      }
    }
  }
  findCall(id) {
    return this.calls.get(id);
  }
  findAssistantCall(id) {
    return this.assistantCalls.get(id);
  }
  closeEverything() {
    for (const id of [...this.openMessages, ...this.openReasoning]) this.touch(this.byId.get(id));
    for (const id of this.openToolCalls) this.touch(this.calls.get(id)?.[0]);
    this.openMessages.clear();
    this.openToolCalls.clear();
    this.openReasoning.clear();
    this.openReasoningSpans.clear();
    this.activeSubagents.clear();
    const run = this.currentRun;
    if (run) {
      for (const step of run.steps) if (step.status === "running") step.status = "interrupted";
      this.changes.changedRuns.add(run);
    }
    this.changes.open = true;
  }
  forgetRemoved() {
    const ids = new Set(this.messages.filter((m) => m.role !== "activity").map((m) => m.id));
    for (const tracked of [this.openMessages, this.openReasoning]) {
      for (const id of [...tracked]) if (!ids.has(id)) tracked.delete(id);
    }
    for (const id of [...this.openToolCalls]) if (!this.calls.has(id)) this.openToolCalls.delete(id);
    this.changes.open = true;
  }
  changed(part) {
    this.changes[part] = true;
  }
  /** *run* changed (its status, steps, or the sub-agents shown with it). */
  runChanged(run) {
    if (run) this.changes.changedRuns.add(run);
  }
  stepsRun() {
    let run = this.currentRun;
    if (!run) {
      run = { runId: null, parentRunId: null, status: "running", started: null, ended: null, steps: [] };
      this.runs.push(run);
      this.changes.runs = true;
    }
    return run;
  }
};
function textStart(t, e, roleDefault) {
  const id = anyKey(e, "messageId");
  let message = t.message(id);
  if (message && message.role === "activity") return void 0;
  if (!message) {
    message = { id, role: "role" in e ? e.role : roleDefault, content: "" };
    Object.assign(message, pick(e, "name", "subagentRunId"));
    t.add(message);
  }
  mergeMetadata(message, e);
  t.touch(message);
  return message;
}
function textContent(t, e) {
  const message = t.message(anyKey(e, "messageId"));
  if (!("delta" in e)) throw new Malformed("missing field delta");
  if (!message || message.role === "activity") return;
  if (typeof e.delta !== "string") throw new Malformed("delta is not a string");
  const current = message.content;
  message.content = (typeof current === "string" ? current : "") + e.delta;
  mergeMetadata(message, e);
  t.touch(message);
}
function textEnd(t, e) {
  const message = t.message(anyKey(e, "messageId"));
  if (message && message.role !== "activity") {
    mergeMetadata(message, e);
    t.touch(message);
  }
}
function toolParent(t, parentId, toolCallId) {
  let newId;
  if (parentId !== void 0 && parentId !== null) {
    const existing = t.message(parentId);
    if (existing && existing.role === "assistant") return [existing, false];
    newId = existing ? toolCallId : parentId;
  } else {
    newId = toolCallId;
  }
  const parent = { id: newId, role: "assistant", toolCalls: [] };
  t.add(parent);
  return [parent, true];
}
function endRun(t, e, status) {
  t.closeEverything();
  const run = t.currentRun;
  if (run && run.status === "running") {
    run.status = status;
    run.ended = { ...e };
    t.runChanged(run);
  } else {
    t.runs.push({
      runId: e.runId ?? null,
      parentRunId: null,
      status,
      started: null,
      ended: { ...e },
      steps: []
    });
    t.changed("runs");
  }
}
function authoritativeTypes(e) {
  const metadata = e.metadata;
  if (!isObject(metadata) || !(CLIENT_METADATA_KEY in metadata)) return UNDECLARED;
  const declared = metadata[CLIENT_METADATA_KEY];
  if (!isObject(declared)) return [];
  if (!("authoritativeActivityTypes" in declared)) return UNDECLARED;
  const types = declared.authoritativeActivityTypes;
  if (types === null) return null;
  if (Array.isArray(types) && types.every((x) => typeof x === "string")) return types;
  return [];
}
function patched(document2, patch) {
  if (!Array.isArray(patch)) throw new Malformed("a JSON Patch is a list of operations");
  return applyPatch(clone(document2), patch, true, true).newDocument;
}
function patchReason(error) {
  const message = error instanceof Error ? error.message.split("\n")[0] : String(error);
  return `JSON Patch does not apply: ${message}`;
}
var HANDLERS = {
  TEXT_MESSAGE_START(t, e) {
    const message = textStart(t, e, "assistant");
    if (message) {
      t.openMessages.add(message.id);
      t.changed("open");
    }
  },
  TEXT_MESSAGE_CONTENT: textContent,
  TEXT_MESSAGE_END(t, e) {
    textEnd(t, e);
    t.openMessages.delete(e.messageId);
    t.changed("open");
  },
  TOOL_CALL_START(t, e) {
    const id = anyKey(e, "toolCallId");
    const name = str(e, "toolCallName");
    const found = t.findCall(id);
    let owner;
    if (found) {
      let call;
      [owner, call] = found;
      call.function.name = name;
      mergeMetadata(call, e);
    } else {
      let isNew;
      [owner, isNew] = toolParent(t, e.parentMessageId, id);
      if (isNew && (e.subagentRunId ?? null) !== null && !("subagentRunId" in owner)) {
        owner.subagentRunId = e.subagentRunId;
      }
      if (owner.toolCalls === void 0 || owner.toolCalls === null) owner.toolCalls = [];
      const call = { id, type: "function", function: { name, arguments: "" } };
      owner.toolCalls.push(call);
      t.indexCall(owner, call);
      mergeMetadata(call, e);
    }
    t.openToolCalls.add(id);
    t.changed("open");
    t.touch(owner);
  },
  TOOL_CALL_ARGS(t, e) {
    const found = t.findCall(anyKey(e, "toolCallId"));
    if (!("delta" in e)) throw new Malformed("missing field delta");
    if (!found) return;
    if (typeof e.delta !== "string") throw new Malformed("delta is not a string");
    const [owner, call] = found;
    call.function.arguments = (call.function.arguments ?? "") + e.delta;
    mergeMetadata(call, e);
    t.touch(owner);
  },
  TOOL_CALL_END(t, e) {
    const id = anyKey(e, "toolCallId");
    const found = t.findCall(id);
    if (found) {
      mergeMetadata(found[1], e);
      t.touch(found[0]);
    }
    t.openToolCalls.delete(id);
    t.changed("open");
  },
  TOOL_CALL_RESULT(t, e) {
    const toolCallId = anyKey(e, "toolCallId");
    const id = anyKey(e, "messageId");
    if (!("content" in e)) throw new Malformed("missing field content");
    const message = {
      id,
      toolCallId,
      role: pyTruthy(e.role) ? e.role : "tool",
      content: e.content,
      ...pick(e, "subagentRunId")
    };
    mergeMetadata(message, e);
    const found = t.findAssistantCall(toolCallId);
    if (!found) {
      t.add(message);
      return;
    }
    const messages = t.messages;
    let at = messages.indexOf(found[0]) + 1;
    while (at < messages.length && messages[at].role === "tool") at += 1;
    t.insert(at, message);
    t.indexResult(message);
    t.touch(found[0]);
  },
  STATE_SNAPSHOT(t, e) {
    if (!("snapshot" in e)) throw new Malformed("missing field snapshot");
    t.state = e.snapshot;
    t.stateProblem = null;
    t.changed("state");
  },
  STATE_DELTA(t, e) {
    if (!("delta" in e)) throw new Malformed("missing field delta");
    try {
      t.state = patched(t.state, e.delta);
    } catch (error) {
      t.stateProblem = patchReason(error);
      t.changed("state");
      throw new Malformed(t.stateProblem);
    }
    t.changed("state");
  },
  MESSAGES_SNAPSHOT(t, e) {
    const raw = need(e, "messages", Array.isArray, "a list");
    const incoming = raw.map(ownMessage);
    for (const m of incoming) if (!isKey(m.id)) throw new Malformed("a message id is not a string");
    const byId2 = /* @__PURE__ */ new Map();
    for (const m of incoming) byId2.set(m.id, m);
    const owned = authoritativeTypes(e);
    const hasActivity = incoming.some((m) => m.role === "activity");
    const hasReasoning = incoming.some((m) => m.role === "reasoning");
    const preserved = (m) => {
      if (m.role === "activity") {
        if (Array.isArray(owned)) return !owned.includes(m.activityType);
        return owned === UNDECLARED && !hasActivity;
      }
      return m.role === "reasoning" && !hasReasoning;
    };
    const kept = t.messages.filter((m) => byId2.has(m.id) || preserved(m)).map((m) => byId2.get(m.id) ?? m);
    const keptIds = new Set(kept.map((m) => m.id));
    for (const m of incoming) if (!keptIds.has(m.id)) kept.push(m);
    t.messages = kept;
    t.reindex();
    for (const m of kept) t.adopt(m);
    t.forgetRemoved();
  },
  ACTIVITY_SNAPSHOT(t, e) {
    const id = anyKey(e, "messageId");
    const activityType = need(e, "activityType", () => true, "");
    const content = need(e, "content", () => true, "");
    const existing = t.message(id);
    const replace = "replace" in e ? pyTruthy(e.replace) : true;
    const fresh = { id, role: "activity", activityType, content, ...pick(e, "subagentRunId") };
    let target;
    if (!existing) {
      t.add(fresh);
      target = fresh;
    } else if (existing.role === "activity") {
      target = existing;
      if (replace) {
        target.activityType = activityType;
        target.content = content;
        delete target.subagentRunId;
        Object.assign(target, pick(e, "subagentRunId"));
      }
    } else if (replace) {
      t.messages[t.messages.indexOf(existing)] = target = fresh;
      t.adopt(fresh);
      t.reindex();
      t.forgetRemoved();
    } else {
      target = null;
    }
    mergeMetadata(target, e);
    t.touch(target);
  },
  ACTIVITY_DELTA(t, e) {
    const id = anyKey(e, "messageId");
    const patch = need(e, "patch", () => true, "");
    const activityType = need(e, "activityType", () => true, "");
    const current = t.message(id);
    if (!current || current.role !== "activity") return;
    const base = pyTruthy(current.content) ? current.content : {};
    try {
      current.content = patched(base, patch);
    } catch (error) {
      throw new Malformed(patchReason(error));
    }
    current.activityType = activityType;
    mergeMetadata(current, e);
    t.touch(current);
  },
  RUN_STARTED(t, e) {
    const input = e.input;
    let inputMessages = [];
    if (isObject(input) && input.messages !== void 0 && input.messages !== null) {
      if (!Array.isArray(input.messages)) throw new Malformed("input.messages is not a list");
      inputMessages = input.messages.map(ownMessage);
      if (!inputMessages.every((m) => isKey(m.id))) throw new Malformed("a message id is not a string");
    }
    t.closeEverything();
    for (const earlier of t.runs) {
      if (earlier.started && "input" in earlier.started) {
        const { input: _dropped, ...rest } = earlier.started;
        earlier.started = rest;
      }
    }
    const started = { ...e };
    if (isObject(input) && pyTruthy(input.messages)) started.input = { ...input, messages: [] };
    t.runs.push({
      runId: e.runId ?? null,
      parentRunId: e.parentRunId ?? null,
      status: "running",
      started,
      ended: null,
      steps: []
    });
    t.changed("runs");
    for (const message of inputMessages) if (!t.message(message.id)) t.add(message);
  },
  RUN_FINISHED(t, e) {
    endRun(t, e, "finished");
  },
  RUN_ERROR(t, e) {
    endRun(t, e, "error");
  },
  STEP_STARTED(t, e) {
    const name = str(e, "stepName");
    const step = { name, status: "running" };
    if (typeof e.subagentRunId === "string") step.subagentRunId = e.subagentRunId;
    const run = t.stepsRun();
    run.steps.push(step);
    t.runChanged(run);
  },
  STEP_FINISHED(t, e) {
    const name = str(e, "stepName");
    const lane = e.subagentRunId ?? void 0;
    const run = t.currentRun;
    const step = run?.steps.slice().reverse().find((s) => s.name === name && s.subagentRunId === lane && s.status === "running");
    if (step) step.status = "finished";
    t.runChanged(run);
  },
  REASONING_START(t, e) {
    t.openReasoningSpans.add(anyKey(e, "messageId"));
    t.changed("open");
  },
  REASONING_END(t, e) {
    t.openReasoningSpans.delete(anyKey(e, "messageId"));
    t.changed("open");
  },
  REASONING_MESSAGE_START(t, e) {
    const message = textStart(t, { ...e, role: "reasoning" }, "reasoning");
    if (message) {
      t.openReasoning.add(message.id);
      t.changed("open");
    }
  },
  REASONING_MESSAGE_CONTENT: textContent,
  REASONING_MESSAGE_END(t, e) {
    textEnd(t, e);
    t.openReasoning.delete(e.messageId);
    t.changed("open");
  },
  REASONING_ENCRYPTED_VALUE(t, e) {
    const entity = anyKey(e, "entityId");
    const value = need(e, "encryptedValue", () => true, "");
    if (e.subtype === "tool-call") {
      const found = t.findAssistantCall(entity);
      if (found) found[1].encryptedValue = value;
      return;
    }
    const target = t.message(entity);
    if (target && target.role !== "activity") target.encryptedValue = value;
  },
  SUBAGENT_STARTED(t, e) {
    t.activeSubagents.set(anyKey(e, "subagentRunId"), { ...e });
    t.runChanged(t.currentRun);
  },
  SUBAGENT_FINISHED(t, e) {
    t.activeSubagents.delete(anyKey(e, "subagentRunId"));
    t.runChanged(t.currentRun);
  },
  SUBAGENT_ERROR(t, e) {
    t.activeSubagents.delete(anyKey(e, "subagentRunId"));
    t.runChanged(t.currentRun);
  }
};

// src/viewer.ts
var RECENT_KEY = "agui-hub.viewer.recent";
var TOKEN_KEY = "agui-hub.viewer.token";
function tokenKey(hub) {
  return `${TOKEN_KEY} ${hub}`;
}
var RECENT_MAX = 12;
var TREE_CHILDREN_MAX = 500;
var PREVIEW_CHARS = 140;
function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== void 0) node.textContent = text;
  return node;
}
function byId(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node;
}
function testId(id) {
  const node = document.querySelector(`[data-testid="${id}"]`);
  if (!node) throw new Error(`the page has no [data-testid=${id}]`);
  return node;
}
var COMPACT_JSON = 120;
function prettyJson(value) {
  const line = oneLine(value, { left: COMPACT_JSON });
  return line ?? JSON.stringify(value, null, 2);
}
function oneLine(value, budget) {
  let text;
  if (Array.isArray(value)) {
    budget.left -= 2;
    const parts = [];
    for (const item of value) {
      if (budget.left < 0) return null;
      const part = oneLine(item, budget);
      if (part === null) return null;
      parts.push(part);
      budget.left -= 2;
    }
    text = `[${parts.join(", ")}]`;
  } else if (value !== null && typeof value === "object") {
    budget.left -= 2;
    const parts = [];
    for (const [key, item] of Object.entries(value)) {
      if (item === void 0) continue;
      const name = JSON.stringify(key);
      budget.left -= name.length + 4;
      if (budget.left < 0) return null;
      const part = oneLine(item, budget);
      if (part === null) return null;
      parts.push(`${name}: ${part}`);
    }
    text = `{${parts.join(", ")}}`;
  } else {
    text = JSON.stringify(value) ?? "null";
    budget.left -= text.length;
  }
  return budget.left < 0 ? null : text;
}
function prettyText(text) {
  const trimmed = text.trim();
  if (!trimmed || !"{[".includes(trimmed[0])) return text;
  try {
    return prettyJson(JSON.parse(trimmed));
  } catch {
    return text;
  }
}
function shown(value) {
  if (typeof value === "string") return value;
  if (value === void 0) return "";
  try {
    return prettyJson(value);
  } catch {
    return String(value);
  }
}
var LiveText = class {
  node = document.createTextNode("");
  #text = "";
  set(text) {
    if (text === this.#text) return;
    if (text.startsWith(this.#text)) this.node.appendData(text.slice(this.#text.length));
    else this.node.data = text;
    this.#text = text;
  }
};
var JsonTree = class {
  root;
  #closed = /* @__PURE__ */ new Set();
  #opened = /* @__PURE__ */ new Set();
  #openDepth;
  constructor(root, openDepth = 2) {
    this.root = root;
    this.#openDepth = openDepth;
  }
  render(value) {
    const fragment = document.createDocumentFragment();
    fragment.append(this.#node(value, null, "", 0));
    this.root.replaceChildren(fragment);
  }
  #isOpen(path, depth) {
    if (this.#closed.has(path)) return false;
    return depth < this.#openDepth || this.#opened.has(path);
  }
  #node(value, key, path, depth) {
    if (value === null || typeof value !== "object") {
      const leaf = el("div", "leaf");
      if (key !== null) leaf.append(el("span", "key", key), ": ");
      const type = value === null ? "null" : typeof value;
      leaf.append(el("span", type, type === "string" ? JSON.stringify(value) : String(value)));
      return leaf;
    }
    const entries = Array.isArray(value) ? value.map((item, index) => [String(index), item]) : Object.entries(value);
    const details = el("details");
    const summary = el("summary");
    if (key !== null) summary.append(el("span", "key", key), ": ");
    const brackets = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
    summary.append(el("span", "count", `${brackets[0]}${entries.length}${brackets[1]}`));
    details.append(summary);
    const fill = () => {
      if (details.childElementCount > 1) return;
      const shownEntries = entries.slice(0, TREE_CHILDREN_MAX);
      for (const [childKey, child] of shownEntries) {
        details.append(this.#node(child, childKey, `${path}/${childKey}`, depth + 1));
      }
      if (entries.length > shownEntries.length) {
        details.append(el("div", "more", `… ${entries.length - shownEntries.length} more`));
      }
    };
    if (this.#isOpen(path, depth)) {
      details.open = true;
      fill();
    }
    details.addEventListener("toggle", () => {
      if (details.open) {
        this.#closed.delete(path);
        this.#opened.add(path);
        fill();
      } else {
        this.#opened.delete(path);
        this.#closed.add(path);
      }
    });
    return details;
  }
};
var CallView = class {
  el = el("div", "call");
  #name = el("span", "call-name");
  #state = el("span", "call-state");
  #args = el("pre", "args");
  #argsText = new LiveText();
  #result = el("div", "result");
  #resultBody = el("pre", "result-body");
  #pretty = false;
  #shown = null;
  constructor() {
    const head = el("div", "call-head");
    head.append(el("span", "call-icon", "tool call"), this.#name, this.#state);
    this.#args.append(this.#argsText.node);
    this.#result.append(el("span", "result-label", "result"), this.#resultBody);
    this.#result.hidden = true;
    this.el.append(head, this.#args, this.#result);
  }
  update(call, open, result) {
    const name = call.function?.name;
    this.#name.textContent = typeof name === "string" ? name : "tool";
    const args = typeof call.function?.arguments === "string" ? call.function.arguments : "";
    const done = result !== void 0;
    const shownNow = [args, open, done, result?.content];
    if (this.#shown && this.#shown.every((part, i) => part === shownNow[i])) return;
    this.#shown = shownNow;
    this.el.dataset.open = String(open);
    this.el.dataset.done = String(done);
    this.#state.textContent = open ? "streaming arguments…" : done ? "done" : "waiting for the result…";
    if (open) {
      if (this.#pretty) {
        this.#args.replaceChildren(this.#argsText.node);
        this.#pretty = false;
      }
      this.#argsText.set(args);
    } else {
      this.#args.textContent = prettyText(args);
      this.#pretty = true;
    }
    this.#result.hidden = !done;
    if (done) this.#resultBody.textContent = prettyText(shown(result.content));
  }
};
var MessageView = class {
  el;
  #content = el("div", "content");
  #text = new LiveText();
  #who = el("div", "who");
  #calls = el("div", "calls");
  #preview = null;
  #callViews = /* @__PURE__ */ new Map();
  #tree = null;
  constructor(message) {
    const role = typeof message.role === "string" ? message.role : "message";
    if (role === "reasoning") {
      const details = el("details", "msg reasoning");
      const summary = el("summary");
      this.#who.textContent = "reasoning";
      this.#preview = el("span", "preview");
      this.#preview.dataset.noText = "";
      summary.append(this.#who, this.#preview);
      details.append(summary, this.#content);
      this.el = details;
    } else {
      this.el = el("article", "msg");
      this.el.append(this.#who, this.#content);
      if (role === "activity") {
        this.el.classList.add("activity");
        this.#tree = new JsonTree(this.#content, 3);
      } else if (role === "tool") {
        this.el.classList.add("tool");
      }
      this.el.append(this.#calls);
    }
    this.el.dataset.role = role;
    this.#content.append(this.#text.node);
  }
  update(message, model) {
    const role = typeof message.role === "string" ? message.role : "message";
    const id = message.id;
    const name = typeof message.name === "string" ? ` · ${message.name}` : "";
    const subagent = typeof message.subagentRunId === "string" ? ` · ${message.subagentRunId}` : "";
    if (role === "activity") {
      this.#who.textContent = `activity · ${shown(message.activityType)}${subagent}`;
      this.#tree?.render(message.content ?? {});
      return;
    }
    if (role === "tool") {
      this.#who.textContent = `tool result${name}${subagent}`;
      this.#text.set(prettyText(shown(message.content)));
      return;
    }
    if (role !== "reasoning") this.#who.textContent = `${role}${name}${subagent}`;
    const streaming = model.openMessages.has(id) || model.openReasoning.has(id);
    this.el.dataset.streaming = String(streaming);
    const text = shown(message.content);
    this.#text.set(text);
    if (this.#preview) {
      this.#who.textContent = streaming ? "reasoning…" : "reasoning";
      this.#preview.textContent = text.length > PREVIEW_CHARS ? `…${text.slice(-PREVIEW_CHARS)}` : text;
    }
    const calls = Array.isArray(message.toolCalls) ? message.toolCalls : [];
    const seen = /* @__PURE__ */ new Set();
    const order = [];
    for (const call of calls) {
      if (call === null || typeof call !== "object" || seen.has(call)) continue;
      seen.add(call);
      let view = this.#callViews.get(call);
      if (!view) {
        view = new CallView();
        this.#callViews.set(call, view);
      }
      order.push(view.el);
      view.update(call, model.openToolCalls.has(call.id), model.resultOf(call.id));
    }
    for (const call of [...this.#callViews.keys()]) if (!seen.has(call)) this.#callViews.delete(call);
    reorder(this.#calls, order);
  }
};
var RunView = class {
  el = el("section", "run");
  body = el("div", "run-body");
  #title = el("span", "run-title");
  #status = el("span", "run-status");
  #steps = el("span", "steps");
  #error = el("div", "run-error");
  #result = el("details", "run-result");
  #resultTree;
  constructor() {
    const head = el("div", "run-head");
    head.append(this.#title, this.#status, this.#steps, this.#error);
    const summary = el("summary", void 0, "result");
    const tree = el("div", "json-tree");
    this.#result.append(summary, tree);
    this.#resultTree = new JsonTree(tree, 1);
    this.el.append(head, this.body, this.#result);
  }
  update(run, active, latest) {
    if (run === null) {
      this.el.dataset.status = "none";
      this.#title.textContent = "before any run";
      this.#status.hidden = true;
      this.#error.hidden = true;
      this.#result.hidden = true;
      return;
    }
    this.el.dataset.status = run.status;
    const parent = run.parentRunId ? ` (from ${run.parentRunId})` : "";
    this.#title.textContent = `run ${run.runId ?? "?"}${parent}`;
    this.#status.hidden = false;
    this.#status.textContent = run.status;
    const chips = run.steps.map((step) => {
      const chip = el("span", "step", step.subagentRunId ? `${step.subagentRunId}: ${step.name}` : step.name);
      chip.dataset.status = step.status;
      chip.title = `step ${step.status}`;
      return chip;
    });
    if (latest) {
      for (const id of active.keys()) {
        const chip = el("span", "step", `subagent ${id}`);
        chip.dataset.status = "running";
        chips.push(chip);
      }
    }
    this.#steps.replaceChildren(...chips);
    const ended = run.ended ?? {};
    const message = run.status === "error" ? shown(ended.message ?? "the run failed") : "";
    this.#error.hidden = !message;
    this.#error.textContent = message ? `error: ${message}${ended.code ? ` (${shown(ended.code)})` : ""}` : "";
    const hasResult = run.status === "finished" && ended.result !== void 0;
    this.#result.hidden = !hasResult;
    if (hasResult) this.#resultTree.render(ended.result);
  }
};
var TranscriptView = class {
  root;
  #messages = /* @__PURE__ */ new Map();
  #runs = /* @__PURE__ */ new Map();
  #newRuns = [];
  // views #layout made, not filled in yet
  #latest = null;
  // the latest run at the last render
  #empty;
  constructor(root) {
    this.root = root;
    this.#empty = el("div", "empty");
    this.root.replaceChildren(this.#empty);
  }
  setEmptyText(parts) {
    this.#empty.replaceChildren(...parts);
  }
  clear() {
    this.#messages.clear();
    this.#runs.clear();
    this.root.replaceChildren(this.#empty);
  }
  render(model) {
    const changes = model.takeChanges();
    if (changes.reset) this.clear();
    const created = changes.reset || changes.order || changes.runs ? this.#layout(model) : [];
    const updated = changes.reset ? new Set(model.messages) : changes.messages;
    for (const message of created) updated.add(message);
    for (const message of updated) {
      const view = this.#messages.get(message);
      if (view) view.update(message, model);
      else if (model.isAttachedResult(message)) {
        const owner = model.callOwner(message.toolCallId);
        if (owner) this.#messages.get(owner)?.update(owner, model);
      }
    }
    const latest = model.currentRun;
    const runs = /* @__PURE__ */ new Set([...this.#newRuns, ...changes.changedRuns]);
    if (changes.runs || changes.open || changes.reset) {
      runs.add(this.#latest);
      runs.add(latest);
    }
    for (const run of runs) this.#runs.get(run)?.update(run, model.activeSubagents, run === latest);
    this.#newRuns = [];
    this.#latest = latest;
  }
  /** Put every message's view in its run's section, in the model's order; returns the
   * messages whose views are new. */
  #layout(model) {
    const created = [];
    const wanted = /* @__PURE__ */ new Map();
    for (const run of model.runs) wanted.set(run, []);
    const alive = /* @__PURE__ */ new Set();
    for (const message of model.messages) {
      if (model.isAttachedResult(message)) continue;
      let view = this.#messages.get(message);
      if (!view) {
        view = new MessageView(message);
        this.#messages.set(message, view);
        created.push(message);
      }
      alive.add(message);
      const run = model.runFor(message);
      const key = run !== null && wanted.has(run) ? run : null;
      if (!wanted.has(key)) wanted.set(key, []);
      wanted.get(key).push(view.el);
    }
    for (const message of [...this.#messages.keys()]) {
      if (!alive.has(message)) this.#messages.delete(message);
    }
    const sections = [];
    const order = wanted.has(null) ? [null, ...model.runs] : [...model.runs];
    for (const run of order) {
      let view = this.#runs.get(run);
      if (!view) {
        view = new RunView();
        this.#runs.set(run, view);
        this.#newRuns.push(run);
      }
      reorder(view.body, wanted.get(run) ?? []);
      sections.push(view.el);
    }
    for (const run of [...this.#runs.keys()]) if (!wanted.has(run)) this.#runs.delete(run);
    if (!sections.length) sections.push(this.#empty);
    reorder(this.root, sections);
    return created;
  }
};
function reorder(parent, children) {
  let cursor = parent.firstChild;
  for (const child of children) {
    if (cursor === child) {
      cursor = cursor.nextSibling;
    } else {
      parent.insertBefore(child, cursor);
    }
  }
  while (cursor) {
    const next = cursor.nextSibling;
    parent.removeChild(cursor);
    cursor = next;
  }
}
function textOf(root) {
  const lines = [];
  let line = "";
  const blocks = /* @__PURE__ */ new Set(["DIV", "SECTION", "ARTICLE", "DETAILS", "SUMMARY", "PRE", "HEADER", "P"]);
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) {
      line += node.data;
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const element = node;
    if ("noText" in element.dataset) return;
    if (element.hidden) return;
    const block = blocks.has(element.tagName);
    if (block && line) {
      lines.push(line);
      line = "";
    }
    for (let child = element.firstChild; child; child = child.nextSibling) walk(child);
    if (block && line) {
      lines.push(line);
      line = "";
    } else if (!block && line && !line.endsWith(" ")) {
      line += " ";
    }
  };
  walk(root);
  if (line) lines.push(line);
  return lines.map((l) => l.trimEnd()).filter((l) => l).join("\n");
}
function hubUrl() {
  const param = new URLSearchParams(location.search).get("hub");
  if (param) {
    const url2 = new URL(param, location.href);
    if (url2.protocol === "http:") url2.protocol = "ws:";
    if (url2.protocol === "https:") url2.protocol = "wss:";
    return url2.href;
  }
  const url = new URL(".", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = "";
  url.hash = "";
  return url.href;
}
function readHash() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}
function storage(kind) {
  try {
    return kind === "local" ? window.localStorage : window.sessionStorage;
  } catch {
    return null;
  }
}
function recentThreads() {
  try {
    const list = JSON.parse(storage("local")?.getItem(RECENT_KEY) ?? "[]");
    return Array.isArray(list) ? list.filter((t) => typeof t === "string") : [];
  } catch {
    return [];
  }
}
function rememberThread(thread) {
  const list = [thread, ...recentThreads().filter((t) => t !== thread)].slice(0, RECENT_MAX);
  try {
    storage("local")?.setItem(RECENT_KEY, JSON.stringify(list));
  } catch {
  }
}
function threadProblem(thread) {
  if (!thread) return "type a thread id";
  if (thread.length > 256) return "a thread id has at most 256 characters";
  if (/[\u0000-\u001f\u007f]/.test(thread)) return "a thread id has no control characters";
  return null;
}
var Viewer = class {
  model = new Transcript();
  connection;
  #view;
  #state;
  #client = null;
  #sub = null;
  #frame = 0;
  #generation = 0;
  #stateShown = void 0;
  #threadInput = byId("thread");
  #encoding = byId("encoding");
  #token = byId("token");
  #recent = byId("recent-threads");
  #indicator = byId("connection");
  #status = testId("status");
  #reconnects = testId("reconnects");
  #resume = testId("resume");
  #notice = byId("notice");
  #stateProblem = byId("state-problem");
  #eventsLine = byId("events-line");
  constructor() {
    this.#view = new TranscriptView(testId("transcript"));
    this.#state = new JsonTree(byId("state"), 3);
    this.connection = {
      state: "idle",
      attempt: 0,
      reconnects: 0,
      closeCode: null,
      closeReason: "",
      error: null,
      hub: "",
      encoding: "msgpack",
      thread: null,
      from: "start",
      subscribed: false,
      stopped: null,
      resumes: [],
      snapshots: 0,
      trimmed: false,
      items: 0
    };
    try {
      this.connection.hub = hubUrl();
    } catch {
      this.#notify("error", "the hub parameter is not a URL: use ?hub=ws://host:port/");
    }
    if (new URLSearchParams(location.search).has("hub") && this.connection.hub) {
      const hub = byId("hub");
      hub.textContent = `hub ${new URL(this.connection.hub).host}`;
      hub.title = this.connection.hub;
      hub.hidden = false;
    }
    this.#token.value = storage("session")?.getItem(tokenKey(this.connection.hub)) ?? "";
    this.#fillRecent();
    byId("thread-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.#setHash({ thread: this.#threadInput.value.trim() });
    });
    this.#encoding.addEventListener("change", () => this.#setHash({ encoding: this.#encoding.value }));
    byId("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = this.#token.value.trim();
      const key = tokenKey(this.connection.hub);
      if (token) storage("session")?.setItem(key, token);
      else storage("session")?.removeItem(key);
      byId("token-box").open = false;
      this.#connect();
    });
    window.addEventListener("hashchange", () => this.#fromHash());
    this.#showEmpty();
    this.#fromHash();
  }
  // -- what tests (and curious people) can read: window.aguiViewer ----------------------------
  snapshot() {
    return { ...this.model.snapshot(), connection: structuredClone(this.connection) };
  }
  transcriptText() {
    this.#render();
    return textOf(this.#view.root);
  }
  // -- settings --------------------------------------------------------------------------------------
  #setHash(changes) {
    const params = readHash();
    for (const [key, value] of Object.entries(changes)) {
      if (value) params.set(key, value);
      else params.delete(key);
    }
    if (params.get("encoding") === "msgpack") params.delete("encoding");
    const hash = `#${params.toString()}`;
    if (hash !== location.hash) location.hash = hash;
    else this.#fromHash();
  }
  #fromHash() {
    const params = readHash();
    const encoding = params.get("encoding") === "json" ? "json" : "msgpack";
    const from = params.get("from") === "snapshot" ? "snapshot" : "start";
    const thread = (params.get("thread") ?? "").trim();
    this.#encoding.value = encoding;
    if (document.activeElement !== this.#threadInput || !this.#threadInput.value) {
      this.#threadInput.value = thread;
    }
    const changedClient = encoding !== this.connection.encoding;
    const changedThread = thread !== (this.connection.thread ?? "") || from !== this.connection.from;
    this.connection.encoding = encoding;
    this.connection.from = from;
    if (!thread) {
      this.connection.thread = null;
      this.#closeSubscription();
      this.#closeClient();
      this.#showEmpty();
      this.#setStatus("idle");
      return;
    }
    const problem = threadProblem(thread);
    if (problem) {
      this.#notify("error", problem);
      return;
    }
    if (!changedClient && !changedThread && this.#client) return;
    this.connection.thread = thread;
    document.title = `${thread} · agui-hub viewer`;
    rememberThread(thread);
    this.#fillRecent();
    if (changedClient || !this.#client) this.#connect();
    else this.#subscribe();
  }
  #fillRecent() {
    this.#recent.replaceChildren(
      ...recentThreads().map((thread) => {
        const option = el("option");
        option.value = thread;
        return option;
      })
    );
  }
  // -- connection ------------------------------------------------------------------------------------
  #connect() {
    if (!this.connection.thread || !this.connection.hub) return;
    this.#closeSubscription();
    this.#closeClient();
    const token = storage("session")?.getItem(tokenKey(this.connection.hub)) || void 0;
    try {
      this.#client = new HubClient({ url: this.connection.hub, encoding: this.connection.encoding, token });
    } catch (error) {
      this.#notify("error", `cannot connect: ${error.message}`);
      return;
    }
    this.connection.reconnects = 0;
    this.connection.resumes = [];
    const client = this.#client;
    client.onStatus((status) => {
      if (client === this.#client) this.#onStatus(status);
    });
    this.#onStatus(client.status);
    this.#subscribe();
  }
  #closeClient() {
    const client = this.#client;
    this.#client = null;
    if (client) void client.close().catch(() => void 0);
  }
  #closeSubscription() {
    const sub = this.#sub;
    this.#sub = null;
    this.#generation += 1;
    if (sub) void sub.close().catch(() => void 0);
  }
  #subscribe() {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread) return;
    this.#closeSubscription();
    const generation = this.#generation;
    this.model.reset();
    this.#stateShown = void 0;
    this.connection.subscribed = false;
    const wasStopped = this.connection.stopped !== null;
    this.connection.stopped = null;
    if (wasStopped) this.#setStatus(this.connection.state);
    this.connection.resumes = [];
    this.connection.snapshots = 0;
    this.connection.trimmed = false;
    this.connection.items = 0;
    this.#notify(null);
    this.#showWaiting(thread);
    try {
      this.#sub = client.subscribe(thread, {
        from: this.connection.from,
        onItem: (item) => {
          if (generation === this.#generation) this.#onItem(item);
        }
      });
    } catch (error) {
      this.#notify("error", error.message);
      return;
    }
    this.#sub.onEnd((error) => {
      if (generation !== this.#generation || !error) return;
      this.connection.subscribed = false;
      this.connection.error = describe2(error);
      this.connection.stopped = this.connection.error;
      this.#notify("error", this.connection.error);
      this.#setStatus(this.connection.state);
      if (error instanceof CommandRejected && error.code === "unauthorized") {
        byId("token-box").open = true;
        this.#token.focus();
      }
    });
    this.#schedule();
  }
  #onStatus(status) {
    const c = this.connection;
    c.attempt = status.attempt;
    c.reconnects = status.reconnects;
    c.closeCode = status.closeCode;
    c.closeReason = status.closeReason;
    c.error = status.error ? status.error.message : null;
    const state = status.state === "open" ? "live" : status.state;
    if (state === "closed" && status.error) {
      this.#notify("error", describe2(status.error));
    } else if (state !== "live" && status.attempt >= 3) {
      const why = status.error?.message ?? `cannot connect to ${this.connection.hub}`;
      const token = storage("session")?.getItem(tokenKey(this.connection.hub)) ? " (is the token still valid?)" : "";
      this.#notify("error", `${why}${token}; retrying`, true);
    } else if (state === "live") {
      this.#clearConnectionNotice();
    }
    this.#setStatus(state);
  }
  #onItem(item) {
    const c = this.connection;
    c.items += 1;
    if (item.kind === "event") {
      this.model.apply(item.event);
    } else if (item.kind === "snapshot") {
      c.snapshots += 1;
      if (!item.complete) c.trimmed = true;
      this.model.reset();
      this.#stateShown = void 0;
      this.model.applyAll(item.events);
    } else {
      c.subscribed = true;
      if (item.resumed) {
        c.resumes.push({ complete: item.recovered, at: Date.now() });
        this.#showResume();
      } else if (!item.recovered && c.items > 1) {
        this.#notify("info", "the thread was re-created: showing its new history");
      }
    }
    this.#schedule();
  }
  // -- rendering --------------------------------------------------------------------------------------
  #schedule() {
    if (!this.#frame) this.#frame = requestAnimationFrame(() => this.#render());
  }
  #render() {
    if (this.#frame) cancelAnimationFrame(this.#frame);
    this.#frame = 0;
    this.#view.render(this.model);
    if (this.model.state !== this.#stateShown) {
      this.#stateShown = this.model.state;
      this.#state.render(this.model.state);
    }
    const problem = this.model.stateProblem;
    this.#stateProblem.hidden = !problem;
    this.#stateProblem.textContent = problem ? "could not apply an update" : "";
    this.#stateProblem.title = problem ?? "";
    const skipped = this.model.problemCount;
    this.#eventsLine.textContent = `${this.model.eventCount} events` + (skipped ? ` · ${skipped} could not be shown (${this.model.problems.at(-1)?.reason ?? ""})` : "") + (this.connection.trimmed ? " · the beginning of the thread was trimmed" : "");
  }
  #setStatus(state) {
    const c = this.connection;
    c.state = state;
    const stopped = state === "live" && c.stopped !== null;
    this.#indicator.dataset.state = stopped ? "stopped" : state;
    let label = stopped ? "not following" : state;
    if (state === "reconnecting") label = `reconnecting (attempt ${Math.max(c.attempt, 1)})`;
    if (state === "connecting" && c.attempt > 1) label = `connecting (attempt ${c.attempt})`;
    if (state === "closed" && c.closeCode !== null) label = `closed (${c.closeCode})`;
    this.#status.textContent = label;
    this.#indicator.title = (stopped ? c.stopped : c.error) ?? c.closeReason ?? "";
    this.#reconnects.textContent = String(c.reconnects);
  }
  #showResume() {
    const last = this.connection.resumes.at(-1);
    if (!last) {
      this.#resume.textContent = "";
      return;
    }
    const resumes = this.connection.resumes;
    const complete = resumes.filter((r) => r.complete).length;
    this.#resume.title = `${resumes.length} resumes: ${complete} complete, ${resumes.length - complete} from a snapshot`;
    this.#resume.dataset.complete = String(last.complete);
    this.#resume.textContent = last.complete ? "resumed, nothing missed" : "resumed from a snapshot: events between were trimmed";
  }
  #showWaiting(thread) {
    this.#resume.textContent = "";
    const code = el("code", void 0, thread);
    this.#view.setEmptyText(["Waiting for events on ", code, "…"]);
  }
  #showEmpty() {
    const link = el("a");
    link.href = "#thread=demo";
    link.append(el("code", void 0, "#thread=demo"));
    this.model.reset();
    this.#stateShown = void 0;
    this.#view.setEmptyText([
      "Type a thread id above to follow it. To see one stream, run ",
      el("code", void 0, "agui-hub demo demo"),
      " and open ",
      link,
      "."
    ]);
    this.#schedule();
  }
  #connectionNotice = false;
  #notify(kind, text = "", aboutConnection = false) {
    this.#notice.hidden = kind === null;
    this.#notice.dataset.kind = kind ?? "";
    this.#notice.textContent = text;
    this.#connectionNotice = aboutConnection;
  }
  #clearConnectionNotice() {
    if (this.#connectionNotice) this.#notify(null);
  }
};
function describe2(error) {
  if (error instanceof ConnectionRejected) {
    const what = error.closeCode === 4401 ? "the token was refused" : "the gateway refused the connection";
    return `${what} (${error.closeCode}): ${error.message}`;
  }
  if (error instanceof CommandRejected) {
    if (error.code === "unauthorized") return `this gateway wants a token (under Token): ${error.message}`;
    if (error.code === "forbidden") return `not allowed to read this thread: ${error.message}`;
    return error.message.startsWith(error.code) ? error.message : `${error.code}: ${error.message}`;
  }
  if (error instanceof HubError) return error.message;
  return String(error);
}
function start() {
  const viewer = new Viewer();
  window.aguiViewer = {
    model: () => viewer.snapshot(),
    transcriptText: () => viewer.transcriptText()
  };
}
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
