/* An op's arguments as the dispatch mode's Python writes them (texts.args_slow), and the signature key that
   finds that text again without building it. Why apart: the texts must match the Python path byte for byte
   (tests compare the two recorders), which is easier to check in one place.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_ARGS_H
#define GPULAB_OBSERVER_ARGS_H
#include "observer_state.h"

namespace {

const char *dtype_text(c10::ScalarType st) {
    switch (st) {
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::QInt8: return "qint8";
    case c10::ScalarType::QUInt8: return "quint8";
    case c10::ScalarType::QInt32: return "qint32";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case c10::ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case c10::ScalarType::UInt16: return "uint16";
    case c10::ScalarType::UInt32: return "uint32";
    case c10::ScalarType::UInt64: return "uint64";
    default: return nullptr;
    }
}

std::string lower_name(c10::ScalarType st) {
    const char *t = dtype_text(st);
    if (t)
        return t;
    std::string n = c10::toString(st);
    for (auto &c : n)
        c = (char)tolower((unsigned char)c);
    return n;
}

/* Python's repr of a float (the Python path writes repr(a)) */
std::string float_repr(double d) {
    char *p = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
    std::string r = p ? p : "nan";
    PyMem_Free(p);
    return r;
}

/* repr(a)[:32] with ';' and '|' replaced, as texts.other_text writes it */
std::string clip(std::string s) {
    if (s.size() > 32)
        s.resize(32);
    for (auto &c : s) {
        if (c == ';') c = ',';
        else if (c == '|') c = '/';
    }
    return s;
}

std::string tensor_text(const at::Tensor &t) {
    std::string s = "T|" + lower_name(t.scalar_type()) + "|";
    auto sizes = t.sym_sizes();
    for (size_t i = 0; i < sizes.size(); i++) {
        if (i) s += ",";
        auto v = sizes[i].maybe_as_int();
        s += v ? std::to_string(*v) : std::string("s");
    }
    s += "|";
    if (t.layout() == c10::kStrided) {
        auto strides = t.sym_strides();
        for (size_t i = 0; i < strides.size(); i++) {
            if (i) s += ",";
            auto v = strides[i].maybe_as_int();
            s += v ? std::to_string(*v) : std::string("s");
        }
    }
    s += "|" + t.device().str();
    return s;
}

std::string int_list_text(c10::ArrayRef<int64_t> v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(v[i]);
    }
    return s + "]";
}

std::string value_text(const c10::IValue &v, ArgShow show) {
    if (v.isNone()) return "None";
    if (v.isBool()) return v.toBool() ? "True" : "False";
    if (v.isInt()) {
        int64_t i = v.toInt();
        if (show == SHOW_DTYPE && i >= 0 && i < (int64_t)c10::ScalarType::NumOptions)
            return "torch." + lower_name((c10::ScalarType)i);
        if (show == SHOW_LAYOUT)
            return i == 0 ? "torch.strided" : i == 1 ? "torch.sparse_coo" : "torch.layout(" + std::to_string(i) + ")";
        if (show == SHOW_MEMFMT) {
            static const char *f[] = {"torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                                      "torch.channels_last_3d"};
            return i >= 0 && i < 4 ? f[i] : std::to_string(i);
        }
        return std::to_string(i);
    }
    if (v.isSymInt()) {
        auto m = v.toSymInt().maybe_as_int();
        return m ? std::to_string(*m) : std::string("s");
    }
    if (v.isDouble()) return clip(float_repr(v.toDouble()));
    if (v.isString()) {
        std::string r = "'" + v.toStringRef() + "'";
        return clip(r);
    }
    if (v.isIntList()) return clip(int_list_text(v.toIntVector()));
    if (v.isDevice()) {
        auto d = v.toDevice();
        std::string r = "device(type='" + c10::DeviceTypeName(d.type(), true) + "'";
        if (d.has_index()) r += ", index=" + std::to_string(d.index());
        return clip(r + ")");
    }
    if (v.isScalar()) return clip(v.toScalar().isFloatingPoint() ? float_repr(v.toScalar().toDouble())
                                                                    : std::to_string(v.toScalar().toLong()));
    return clip("<" + std::string(v.tagKind()) + ">");
}

/* the dispatch mode's positional arguments: those before the keyword-only ones, trailing defaults dropped */
bool same_ints(c10::ArrayRef<c10::IValue> a, c10::ArrayRef<c10::IValue> b) {
    if (a.size() != b.size())
        return false;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].toInt() != b[i].toInt())
            return false;
    return true;
}

size_t shown_args(const NameInfo *ni, c10::ArrayRef<const c10::IValue> in) {
    if (!ni->schema)
        return in.size();
    size_t n = std::min(ni->positional, in.size());
    while (n > 0) {
        const ArgInfo &a = ni->args[n - 1];
        if (!a.has_default)
            break;
        const c10::IValue &v = in[n - 1];
        bool same = false;
        if (a.def.isNone()) same = v.isNone();
        else if (a.def.isInt() && v.isInt()) same = a.def.toInt() == v.toInt();
        else if (a.def.isBool() && v.isBool()) same = a.def.toBool() == v.toBool();
        else if (a.def.isDouble() && v.isDouble()) same = a.def.toDouble() == v.toDouble();
        else if (a.def.isIntList() && v.isIntList()) same = same_ints(a.def.toListRef(), v.toListRef());
        else if (a.def.isString() && v.isString()) same = a.def.toStringRef() == v.toStringRef();
        if (!same)
            break;
        n--;
    }
    return n;
}

int32_t device_of(const at::Tensor &t, int32_t dev) {
    if (dev >= 0)
        return dev;
    if (t.device().is_cuda())
        return t.device().has_index() ? t.device().index() : 0;
    return -1;
}

/* texts.args_slow's text: per argument a tensor summary or a clipped repr, joined by ';' (1023 bytes at most) */
/* a Python number torch wrapped into a 0-dim CPU tensor: the dispatch mode is handed the number back */
bool wrapped_number(const at::Tensor &t) {
    return t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number() && t.device().is_cpu() && t.dim() == 0;
}

/* its value, read from memory (item() would dispatch an op from inside the observer): 1 int, 2 float, 0 other */
int number_of(const at::Tensor &t, int64_t *i, double *d) {
    const void *p = t.const_data_ptr();
    switch (t.scalar_type()) {
    case c10::ScalarType::Bool: *i = *(const bool *)p; return 1;
    case c10::ScalarType::Long: *i = *(const int64_t *)p; return 1;
    case c10::ScalarType::Int: *i = *(const int32_t *)p; return 1;
    case c10::ScalarType::Double: *d = *(const double *)p; return 2;
    case c10::ScalarType::Float: *d = *(const float *)p; return 2;
    default: return 0;
    }
}

std::string number_text(const at::Tensor &t) {
    int64_t i = 0;
    double d = 0;
    int k = number_of(t, &i, &d);
    if (k == 1) return t.scalar_type() == c10::ScalarType::Bool ? (i ? "True" : "False") : std::to_string(i);
    if (k == 2) return clip(float_repr(d));
    return clip("<" + lower_name(t.scalar_type()) + " number>");
}

std::string args_text(const NameInfo *ni, c10::ArrayRef<const c10::IValue> in, size_t n, int32_t *dev) {
    std::vector<std::string> parts;
    *dev = -2;
    for (size_t i = 0; i < n; i++) {
        const c10::IValue &v = in[i];
        ArgShow show = ni->schema && i < ni->args.size() ? ni->args[i].show : SHOW_PLAIN;
        if (v.isTensor() && wrapped_number(v.toTensor())) {
            parts.push_back(number_text(v.toTensor()));
        } else if (v.isTensor()) {
            const at::Tensor &t = v.toTensor();
            if (t.defined()) {
                parts.push_back(tensor_text(t));
                *dev = device_of(t, *dev);
            } else {
                parts.push_back("None");
            }
        } else if (v.isTensorList()) {
            auto l = v.toTensorList();
            if (l.size() == 0) {
                parts.push_back("[]");
                continue;
            }
            parts.push_back("L" + std::to_string(l.size()));
            for (size_t j = 0; j < l.size(); j++) {
                at::Tensor x = l.get(j);
                if (!x.defined())
                    continue;
                if (j < 4)
                    parts.push_back(tensor_text(x));
                *dev = device_of(x, *dev);
                if (j >= 4 && *dev >= 0)
                    break;
            }
        } else if (v.isList()) {
            auto l = v.toListRef();
            bool tensors = !l.empty() && l[0].isTensor();
            if (!tensors) {
                parts.push_back(value_text(v, show));
                continue;
            }
            parts.push_back("L" + std::to_string(l.size()));
            for (size_t j = 0; j < l.size(); j++) {
                if (!l[j].isTensor() || !l[j].toTensor().defined())
                    continue;
                if (j < 4)
                    parts.push_back(tensor_text(l[j].toTensor()));
                *dev = device_of(l[j].toTensor(), *dev);
            }
        } else {
            parts.push_back(value_text(v, show));
        }
    }
    std::string s;
    for (size_t i = 0; i < parts.size(); i++) {
        if (i) s += ";";
        s += parts[i];
    }
    if (s.size() > 1023)
        s.resize(1023);
    return s;
}

/* the signature key: everything args_text reads (a hit needs no text) */
bool append_key(KeyBuf &k, const c10::IValue &v) {
    auto put = [&k](const void *p, size_t n) { k.put(p, n); };
    auto tensor = [&](const at::Tensor &t) {
        if (!t.defined()) {
            k.push('n');
            return true;
        }
        if (wrapped_number(t)) {   /* keyed by its value, as the text shows it */
            int64_t i = 0;
            double d = 0;
            int kind = number_of(t, &i, &d);
            if (kind == 0)
                return false;
            k.push('w');
            k.push((char)t.scalar_type());
            if (kind == 1) put(&i, 8);
            else put(&d, 8);
            return true;
        }
        const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
        if (t.layout() == c10::kStrided && !impl->has_symbolic_sizes_strides() && t.dim() <= 12) {
            /* the common case in one append: plain sizes and strides, no SymInt to ask */
            char buf[8 + 2 * 12 * 8];
            c10::IntArrayRef sz = t.sizes(), st = t.strides();
            size_t nd = sz.size();
            buf[0] = 'P';   /* apart from the general form below */
            buf[1] = (char)t.scalar_type();
            buf[2] = (char)t.device().type();
            buf[3] = (char)t.device().index();
            buf[4] = (char)nd;
            memcpy(buf + 5, sz.data(), 8 * nd);
            memcpy(buf + 5 + 8 * nd, st.data(), 8 * nd);
            k.put(buf, 5 + 16 * nd);
            return true;
        }
        k.push('T');
        int8_t meta[4] = {(int8_t)t.scalar_type(), (int8_t)t.device().type(), (int8_t)t.device().index(),
                          (int8_t)t.layout()};
        put(meta, 4);
        auto sizes = t.sym_sizes();
        int16_t d = (int16_t)sizes.size();
        put(&d, 2);
        for (const auto &x : sizes) {
            auto m = x.maybe_as_int();
            if (!m) return false;
            int64_t val = *m;
            put(&val, 8);
        }
        if (t.layout() == c10::kStrided) {
            for (const auto &x : t.sym_strides()) {
                auto m = x.maybe_as_int();
                if (!m) return false;
                int64_t val = *m;
                put(&val, 8);
            }
        }
        return true;
    };
    if (v.isTensor()) return tensor(v.toTensor());
    if (v.isNone()) { k.push('N'); return true; }
    if (v.isInt()) { k.push('i'); int64_t x = v.toInt(); put(&x, 8); return true; }
    if (v.isBool()) { k.push(v.toBool() ? 'B' : 'b'); return true; }
    if (v.isDouble()) { k.push('d'); double x = v.toDouble(); put(&x, 8); return true; }
    if (v.isSymInt()) {
        auto m = v.toSymInt().maybe_as_int();
        if (!m) return false;
        k.push('i');
        int64_t x = *m;
        put(&x, 8);
        return true;
    }
    if (v.isString()) {
        const std::string &s = v.toStringRef();
        k.push('s');
        uint32_t n = (uint32_t)std::min<size_t>(s.size(), 40);
        put(&n, 4);
        put(s.data(), n);
        return true;
    }
    if (v.isIntList()) {   /* read in place (toIntVector would copy the list into a new vector) */
        auto l = v.toListRef();
        k.push('l');
        uint32_t n = (uint32_t)l.size();
        put(&n, 4);
        for (const auto &x : l) {
            int64_t val = x.toInt();
            put(&val, 8);
        }
        return true;
    }
    if (v.isTensorList()) {
        auto l = v.toTensorList();
        k.push('L');
        uint32_t n = (uint32_t)l.size();
        put(&n, 4);
        for (size_t j = 0; j < l.size(); j++)
            if (!tensor(l.get(j))) return false;
        return true;
    }
    if (v.isDevice()) {
        auto d = v.toDevice();
        int8_t m[3] = {'D', (int8_t)d.type(), (int8_t)d.index()};
        put(m, 3);
        return true;
    }
    if (v.isList()) {
        auto l = v.toListRef();
        k.push('[');
        uint32_t n = (uint32_t)l.size();
        put(&n, 4);
        for (const auto &x : l)
            if (!append_key(k, x)) return false;
        return true;
    }
    /* a generator, a process group, a capsule...: shown by its kind, which the tag says */
    k.push('o');
    k.push((char)v.tagKind().size());
    put(v.tagKind().data(), v.tagKind().size());
    return true;
}

}  // namespace

#endif  /* GPULAB_OBSERVER_ARGS_H */
