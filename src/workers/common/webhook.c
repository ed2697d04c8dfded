/*
 * webhook.c: Standard Webhooks signing, the response classifier and Retry-After parsing
 * (see webhook.h).
 */
#include "webhook.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#define SECRET_PREFIX    "whsec_"
#define HMAC_SHA256_SIZE 32

const char *const default_transient_statuses[] = {"408", "425", "429", "5xx"};
const int n_default_transient_statuses = 4;

/*
 * Decodes standard base64 into a fresh buffer. EVP_DecodeBlock wants whole 4-character
 * groups and decodes '=' padding as zero bytes it still counts, so we pad secrets that
 * come without it and take the padding back off the length.
 */
static unsigned char *
decode_base64(const char *text, size_t text_len, size_t *decoded_len)
{
	size_t padded_len = (text_len + 3) / 4 * 4;
	char *padded;
	unsigned char *decoded;
	size_t n_padding = 0;
	int n;

	if (text_len == 0 || text_len > INT32_MAX / 2)
		return NULL;
	padded = malloc(padded_len + 1);
	decoded = malloc(padded_len / 4 * 3 + 1);
	if (!padded || !decoded)
	{
		free(padded);
		free(decoded);
		return NULL;
	}
	memcpy(padded, text, text_len);
	memset(padded + text_len, '=', padded_len - text_len);
	padded[padded_len] = '\0';

	n = EVP_DecodeBlock(decoded, (const unsigned char *) padded, (int) padded_len);
	if (n >= 0)
	{
		while (n_padding < 2 && n_padding < padded_len && padded[padded_len - 1 - n_padding] == '=')
			n_padding++;
		/* "=" anywhere but the end, or a group of only padding, is not base64 we accept. */
		if ((size_t) n < n_padding || memchr(padded, '=', padded_len - n_padding) != NULL)
			n = -1;
	}
	free(padded);
	if (n < 0)
	{
		free(decoded);
		return NULL;
	}
	*decoded_len = (size_t) n - n_padding;
	return decoded;
}

/* The HMAC key a secret stands for: the whsec_ part decoded, or the raw bytes. */
static unsigned char *
signing_key(const char *secret, size_t *key_len)
{
	unsigned char *key;

	if (strncmp(secret, SECRET_PREFIX, strlen(SECRET_PREFIX)) == 0)
	{
		const char *encoded = secret + strlen(SECRET_PREFIX);

		return decode_base64(encoded, strlen(encoded), key_len);
	}
	*key_len = strlen(secret);
	key = malloc(*key_len + 1);
	if (key)
		memcpy(key, secret, *key_len + 1);
	return key;
}

/* HMAC-SHA256 over "<id>.<timestamp>.<body>" without copying the body into one buffer. */
static bool
hmac_sha256_signed_content(const unsigned char *key, size_t key_len, const char *msg_id,
						   long timestamp, const char *body, size_t body_len,
						   unsigned char mac_out[HMAC_SHA256_SIZE])
{
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	char digest_name[] = "SHA256";
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
		OSSL_PARAM_construct_end(),
	};
	char prefix_tail[32];
	size_t mac_len = 0;
	bool ok;

	snprintf(prefix_tail, sizeof(prefix_tail), ".%ld.", timestamp);
	ok = ctx != NULL && EVP_MAC_init(ctx, key, key_len, params) == 1 &&
		 EVP_MAC_update(ctx, (const unsigned char *) msg_id, strlen(msg_id)) == 1 &&
		 EVP_MAC_update(ctx, (const unsigned char *) prefix_tail, strlen(prefix_tail)) == 1 &&
		 (body_len == 0 || EVP_MAC_update(ctx, (const unsigned char *) body, body_len) == 1) &&
		 EVP_MAC_final(ctx, mac_out, &mac_len, HMAC_SHA256_SIZE) == 1 &&
		 mac_len == HMAC_SHA256_SIZE;
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
	return ok;
}

bool
webhook_sign(const char *secret, const char *msg_id, long timestamp, const char *body,
			 size_t body_len, char *out, size_t out_size)
{
	unsigned char *key;
	size_t key_len = 0;
	unsigned char mac[HMAC_SHA256_SIZE];
	bool ok;

	if (out_size > 0)
		out[0] = '\0';
	if (!secret || !msg_id || (!body && body_len > 0) || out_size < WEBHOOK_SIGNATURE_SIZE)
		return false;
	key = signing_key(secret, &key_len);
	if (!key)
		return false;
	/* An empty key signs nothing a destination could trust; treat it as a bad secret. */
	ok = key_len > 0 &&
		 hmac_sha256_signed_content(key, key_len, msg_id, timestamp, body, body_len, mac);
	OPENSSL_cleanse(key, key_len);
	free(key);
	if (!ok)
		return false;

	memcpy(out, "v1,", 3);
	EVP_EncodeBlock((unsigned char *) out + 3, mac, HMAC_SHA256_SIZE);
	return true;
}

bool
webhook_id_is_signable(const char *msg_id)
{
	size_t len = 0;

	if (msg_id == NULL || msg_id[0] == '\0')
		return false;
	for (const unsigned char *p = (const unsigned char *) msg_id; *p; p++, len++)
		if (*p < 0x20 || *p == 0x7f || len >= WEBHOOK_ID_MAX)
			return false;
	return true;
}

bool
webhook_add_header_lines(header_lines *headers, const char *secret, const char *msg_id,
						 long timestamp, const char *body, size_t body_len)
{
	char signature[WEBHOOK_SIGNATURE_SIZE];

	if (!webhook_id_is_signable(msg_id))
		return false;
	if (!webhook_sign(secret, msg_id, timestamp, body, body_len, signature, sizeof(signature)))
		return false;
	header_lines_add(headers, "webhook-id", msg_id);
	header_lines_add_long(headers, "webhook-timestamp", timestamp);
	header_lines_add(headers, "webhook-signature", signature);
	return true;
}

/* "5xx" (a class) or "429" (an exact code); anything else matches nothing. */
static bool
status_matches(const char *entry, long http_status)
{
	size_t len = strlen(entry);

	if (len != 3 || !isdigit((unsigned char) entry[0]))
		return false;
	if (tolower((unsigned char) entry[1]) == 'x' && tolower((unsigned char) entry[2]) == 'x')
		return http_status / 100 == entry[0] - '0';
	if (!isdigit((unsigned char) entry[1]) || !isdigit((unsigned char) entry[2]))
		return false;
	return http_status == strtol(entry, NULL, 10);
}

delivery_outcome
classify_http_result(CURLcode curl_result, long http_status, const char *const *transient_statuses,
					 int n)
{
	/*
	 * Any curl error means the destination gave no verdict on the record, so it is never
	 * the record's fault: even a malformed endpoint is an operator's fix, after which the
	 * retry steps deliver, while the DLQ is kept for records a destination refused.
	 */
	if (curl_result != CURLE_OK || http_status <= 0)
		return DELIVERY_TRANSIENT;
	if (http_status >= 200 && http_status <= 299)
		return DELIVERY_SUCCESS;
	if (!transient_statuses)
	{
		transient_statuses = default_transient_statuses;
		n = n_default_transient_statuses;
	}
	for (int i = 0; i < n; i++)
		if (transient_statuses[i] && status_matches(transient_statuses[i], http_status))
			return DELIVERY_TRANSIENT;
	return DELIVERY_PERMANENT;
}

const char *
delivery_outcome_name(delivery_outcome outcome)
{
	switch (outcome)
	{
		case DELIVERY_SUCCESS:
			return "success";
		case DELIVERY_TRANSIENT:
			return "transient";
		case DELIVERY_PERMANENT:
			return "permanent";
	}
	return "unknown";
}

long
parse_retry_after(const char *header_value, time_t now)
{
	char value[128];
	size_t start = 0;
	size_t len;

	if (!header_value)
		return -1;
	while (isspace((unsigned char) header_value[start]))
		start++;
	len = strlen(header_value + start);
	while (len > 0 && isspace((unsigned char) header_value[start + len - 1]))
		len--;
	if (len == 0 || len >= sizeof(value))
		return -1;
	memcpy(value, header_value + start, len);
	value[len] = '\0';

	if (isdigit((unsigned char) value[0]))
	{
		long long seconds = 0;

		for (size_t i = 0; i < len; i++)
		{
			if (!isdigit((unsigned char) value[i]))
				return -1;
			if (seconds < INT32_MAX)
				seconds = seconds * 10 + (value[i] - '0');
		}
		return seconds > INT32_MAX ? INT32_MAX : (long) seconds;
	}

	/*
	 * Every HTTP-date form (IMF-fixdate, RFC 850, asctime) starts with the day name; curl's
	 * parser reads all three but also much else, so only hand it what looks like one.
	 */
	if (isalpha((unsigned char) value[0]))
	{
		time_t when = curl_getdate(value, NULL);
		long long wait;

		if (when == (time_t) -1)
			return -1;
		wait = (long long) when - (long long) now;
		if (wait < 0)
			return 0;
		return wait > INT32_MAX ? INT32_MAX : (long) wait;
	}
	return -1;
}
